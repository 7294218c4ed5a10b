//! Cron schedules as users write them, and their occurrences (pure).
//!
//! A schedule is a standard 5-field cron expression (minute hour day-of-month month
//! day-of-week), read in an IANA time zone (UTC by default), with the Vixie/POSIX semantics:
//! - values, `*` (or `?`), ranges `a-b`, steps `*/n`, `a-b/n` and `a/n` (= `a-max/n`), lists
//!   `x,y`; months also as `jan`..`dec`, days of the week also as `sun`..`sat`;
//! - day of the week 0-7, where both 0 and 7 are Sunday;
//! - when both day of month and day of week are restricted (neither is `*`, `?` or `*/1`),
//!   a day matches when EITHER matches (`0 3 1 * mon`: the 1st of each month and every
//!   Monday); when one of them is unrestricted, only the other one counts.
//!
//! Each field is checked and expanded here, with a message naming the field; the occurrences
//! are then computed by the `cron` crate from explicit lists, which avoids its surprises: it
//! wants a seconds field (we prepend `0`), numbers days of the week 1-7 from Sunday (we
//! translate), and requires BOTH day fields to match (we take the union of two schedules, one
//! per day field). Six- and seven-field expressions are refused: a hidden seconds field once
//! made `0 1 * * *` run hourly elsewhere.
//!
//! # Daylight saving time
//! The `cron` crate is only asked about wall-clock times (it runs in UTC here, so it never
//! sees a transition); we map each wall-clock occurrence to an instant ourselves:
//! - a local time that does not exist (the hour skipped when clocks go forward) runs once, at
//!   the instant the clocks jump (`30 2 * * *` in Europe/Paris runs at 03:00 CEST that day;
//!   every minute of `* * * * *` within the gap collapses into that one run);
//! - a local time that exists twice (the hour repeated when clocks go back) runs once, at its
//!   first occurrence (`30 1 * * *` in America/New_York runs at 01:30 EDT, not again at
//!   01:30 EST; `* * * * *` pauses during the repeated hour).
//!
//! This mapping never goes backwards in time, so the next occurrence after any instant is the
//! first mapped wall-clock occurrence after it: one run per wall-clock time, never two.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// How many wall-clock occurrences a search may look at before giving up (a bound, never
/// reached by a schedule that has occurrences).
const SEARCH_LIMIT: usize = 100_000;
/// Longer than any change of a zone's UTC offset, so that searching backwards from this far
/// after a wall-clock time cannot miss an occurrence inside a repeated hour.
const OFFSET_CHANGE_MAX: Duration = Duration::days(1);

/// Why a schedule is refused; the message is meant for the user (it goes to a condition).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(pub String);

/// A parsed schedule: its occurrences are instants (UTC).
#[derive(Clone, Debug)]
pub struct Schedule {
    zone: Tz,
    /// One schedule, or two whose union it is (day of month OR day of week).
    parts: Vec<cron::Schedule>,
}

/// What one field may hold.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    /// Names accepted for values (lowercase), in value order from `min`.
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// One field, expanded.
struct Expanded {
    values: BTreeSet<u32>,
    /// `*`, `?` or `*/1`: the field does not restrict anything.
    unrestricted: bool,
}

impl Schedule {
    /// Parses `expression` in `time_zone` (an IANA name; `None` is UTC).
    pub fn parse(expression: &str, time_zone: Option<&str>) -> Result<Self, ScheduleError> {
        let zone = parse_zone(time_zone)?;
        let fields: Vec<&str> = expression.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(ScheduleError(format!(
                "schedule {expression:?} has {} fields; expected 5: minute hour day-of-month \
                 month day-of-week (there is no seconds or year field)",
                fields.len()
            )));
        }
        let invalid =
            |message: String| ScheduleError(format!("schedule {expression:?}: {message}"));
        let minute = expand(fields[0], &MINUTE).map_err(invalid)?;
        let hour = expand(fields[1], &HOUR).map_err(invalid)?;
        let day_of_month = expand(fields[2], &DAY_OF_MONTH).map_err(invalid)?;
        let month = expand(fields[3], &MONTH).map_err(invalid)?;
        let day_of_week = expand(fields[4], &DAY_OF_WEEK).map_err(invalid)?;
        let parts = crate_expressions(&minute, &hour, &day_of_month, &month, &day_of_week)
            .iter()
            .map(|source| {
                source.parse::<cron::Schedule>().map_err(|error| {
                    // Our expansion only emits what the crate accepts: this would be our bug.
                    ScheduleError(format!("schedule {expression:?} is not supported: {error}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let schedule = Schedule { zone, parts };
        if schedule.next_local_after(never_before()).is_none() {
            return Err(ScheduleError(format!(
                "schedule {expression:?} never runs: no date has that day and month"
            )));
        }
        Ok(schedule)
    }

    /// The time zone the schedule is read in.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The first occurrence strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Wall-clock times before `after`'s own map to instants at or before `after`.
        let mut local = self.wall_clock(after);
        for _ in 0..SEARCH_LIMIT {
            local = self.next_local_after(local)?;
            let instant = self.instant(local)?;
            if instant > after {
                return Some(instant);
            }
        }
        None
    }

    /// The last occurrence at or before `at`.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // A wall-clock time after `at`'s own may still map before `at` (inside a repeated
        // hour): start far enough after it.
        let mut local = self.wall_clock(at) + OFFSET_CHANGE_MAX;
        for _ in 0..SEARCH_LIMIT {
            local = self.prev_local_before(local)?;
            let instant = self.instant(local)?;
            if instant <= at {
                return Some(instant);
            }
        }
        None
    }

    fn wall_clock(&self, instant: DateTime<Utc>) -> NaiveDateTime {
        instant.with_timezone(&self.zone).naive_local()
    }

    /// The instant a wall-clock occurrence runs at (see the module's DST rules).
    fn instant(&self, local: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.zone.from_local_datetime(&local) {
            LocalResult::Single(instant) | LocalResult::Ambiguous(instant, _) => {
                Some(instant.with_timezone(&Utc))
            }
            LocalResult::None => self.end_of_gap(local),
        }
    }

    /// The instant the clocks jump over the skipped `local`: that of the first wall-clock
    /// minute after it that exists.
    fn end_of_gap(&self, local: NaiveDateTime) -> Option<DateTime<Utc>> {
        // Gaps last an hour or so; Samoa once skipped a whole day.
        (1..=3 * 24 * 60).find_map(|minutes| {
            let later = local + Duration::minutes(minutes);
            self.zone
                .from_local_datetime(&later)
                .earliest()
                .map(|instant| instant.with_timezone(&Utc))
        })
    }

    /// The first wall-clock occurrence strictly after `local`.
    fn next_local_after(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        self.parts
            .iter()
            .filter_map(|part| part.after(&local.and_utc()).next())
            .map(|t| t.naive_utc())
            .min()
    }

    /// The last wall-clock occurrence strictly before `local`.
    fn prev_local_before(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        self.parts
            .iter()
            .filter_map(|part| part.after(&local.and_utc()).next_back())
            .map(|t| t.naive_utc())
            .max()
    }
}

/// Where the search for a first occurrence starts when checking that there is one.
fn never_before() -> NaiveDateTime {
    DateTime::<Utc>::UNIX_EPOCH.naive_utc()
}

fn parse_zone(time_zone: Option<&str>) -> Result<Tz, ScheduleError> {
    match time_zone {
        None => Ok(Tz::UTC),
        Some(name) => name.parse::<Tz>().map_err(|_| {
            ScheduleError(format!(
                "unknown time zone {name:?}: use an IANA time zone name such as \
                 \"Europe/Paris\" or \"America/New_York\" (names are case-sensitive)"
            ))
        }),
    }
}

/// The `cron` crate's 6-field expressions (seconds first, days of the week 1-7 from Sunday)
/// whose union is the schedule.
fn crate_expressions(
    minute: &Expanded,
    hour: &Expanded,
    day_of_month: &Expanded,
    month: &Expanded,
    day_of_week: &Expanded,
) -> Vec<String> {
    // 0 and 7 are both Sunday, which the crate numbers 1.
    let weekdays: BTreeSet<u32> = day_of_week.values.iter().map(|d| d % 7 + 1).collect();
    let (minutes, hours, months) = (
        list(&minute.values),
        list(&hour.values),
        list(&month.values),
    );
    let days = list(&day_of_month.values);
    let weekdays = list(&weekdays);
    let expression = |dom: &str, dow: &str| format!("0 {minutes} {hours} {dom} {months} {dow}");
    match (day_of_month.unrestricted, day_of_week.unrestricted) {
        (true, true) => vec![expression("*", "*")],
        (true, false) => vec![expression("*", &weekdays)],
        (false, true) => vec![expression(&days, "*")],
        // Standard cron: either day field matching is enough.
        (false, false) => vec![expression(&days, "*"), expression("*", &weekdays)],
    }
}

/// `1,2,3` from a set of values.
fn list(values: &BTreeSet<u32>) -> String {
    let mut out = String::new();
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{value}");
    }
    out
}

/// Expands one field into the values it matches, or says what is wrong with it.
fn expand(text: &str, field: &Field) -> Result<Expanded, String> {
    let mut values = BTreeSet::new();
    for item in text.split(',') {
        expand_item(item, field, &mut values)?;
    }
    let unrestricted = matches!(text, "*" | "?" | "*/1");
    Ok(Expanded {
        values,
        unrestricted,
    })
}

/// One element of a list: `*`, `?`, `v`, `a-b`, each optionally `/step`.
fn expand_item(item: &str, field: &Field, values: &mut BTreeSet<u32>) -> Result<(), String> {
    let name = field.name;
    if item.is_empty() {
        return Err(format!("{name} field has an empty list element"));
    }
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => {
            let step: u32 = step
                .parse()
                .ok()
                .filter(|step| *step > 0)
                .ok_or_else(|| format!("{name} step {step:?} is not a positive number"))?;
            (range, Some(step))
        }
        None => (item, None),
    };
    let (start, end) = match range {
        "*" | "?" => (field.min, field.max),
        _ => match range.split_once('-') {
            Some((low, high)) => {
                let (low, high) = (value(low, field)?, value(high, field)?);
                if low > high {
                    return Err(format!(
                        "{name} range {range:?} goes backwards (write it as a list of two ranges)"
                    ));
                }
                (low, high)
            }
            // `a/n` means from a to the end, every n.
            None if step.is_some() => (value(range, field)?, field.max),
            None => {
                let single = value(range, field)?;
                (single, single)
            }
        },
    };
    let step = usize::try_from(step.unwrap_or(1)).unwrap_or(usize::MAX);
    values.extend((start..=end).step_by(step));
    Ok(())
}

/// A number or a name within the field's range.
fn value(text: &str, field: &Field) -> Result<u32, String> {
    let (name, min, max) = (field.name, field.min, field.max);
    let value = match text.parse::<u32>() {
        Ok(number) => number,
        Err(_) => {
            let lower = text.to_ascii_lowercase();
            let position = field.names.iter().position(|n| *n == lower);
            let index = position.ok_or_else(|| unknown_value(text, field))?;
            field.min + u32::try_from(index).unwrap_or(u32::MAX)
        }
    };
    if !(min..=max).contains(&value) {
        return Err(format!("{name} {value} is out of range {min}-{max}"));
    }
    Ok(value)
}

fn unknown_value(text: &str, field: &Field) -> String {
    let name = field.name;
    if field.names.is_empty() {
        format!("{name} {text:?} is not a number")
    } else {
        format!(
            "{name} {text:?} is neither a number nor one of {}",
            field.names.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("RFC 3339")
            .with_timezone(&Utc)
    }

    fn schedule(expression: &str) -> Schedule {
        Schedule::parse(expression, None).expect("valid schedule")
    }

    /// The first `n` occurrences after `after`, as RFC 3339 UTC.
    fn next_n(schedule: &Schedule, after: &str, n: usize) -> Vec<String> {
        let mut at = utc(after);
        let mut out = Vec::new();
        for _ in 0..n {
            at = schedule.next_after(at).expect("an occurrence");
            out.push(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        }
        out
    }

    fn error(expression: &str, zone: Option<&str>) -> String {
        Schedule::parse(expression, zone).expect_err("refused").0
    }

    #[test]
    fn five_fields_without_seconds() {
        // `0 1 * * *` is 01:00 daily, not every hour at second 0 of minute 1.
        assert_eq!(
            next_n(&schedule("0 1 * * *"), "2025-01-01T00:00:00Z", 2),
            ["2025-01-01T01:00:00Z", "2025-01-02T01:00:00Z"]
        );
        assert_eq!(
            next_n(&schedule("*/20 * * * *"), "2025-01-01T00:00:00Z", 3),
            [
                "2025-01-01T00:20:00Z",
                "2025-01-01T00:40:00Z",
                "2025-01-01T01:00:00Z"
            ]
        );
        // `a/n`, ranges with steps, lists, names.
        assert_eq!(
            next_n(&schedule("50/5 9-17/8 * * *"), "2025-01-01T00:00:00Z", 3),
            [
                "2025-01-01T09:50:00Z",
                "2025-01-01T09:55:00Z",
                "2025-01-01T17:50:00Z"
            ]
        );
        assert_eq!(
            next_n(&schedule("0 0 1 jan,JUL *"), "2025-01-01T00:00:00Z", 2),
            ["2025-07-01T00:00:00Z", "2026-01-01T00:00:00Z"]
        );
    }

    #[test]
    fn the_next_occurrence_is_strictly_after_and_the_latest_at_or_before() {
        let every_hour = schedule("0 * * * *");
        let at = utc("2025-01-01T10:00:00Z");
        assert_eq!(every_hour.next_after(at), Some(utc("2025-01-01T11:00:00Z")));
        assert_eq!(every_hour.latest_at_or_before(at), Some(at));
        assert_eq!(
            every_hour.latest_at_or_before(utc("2025-01-01T10:59:59Z")),
            Some(at)
        );
        assert_eq!(
            every_hour.next_after(utc("2025-01-01T10:59:59.5Z")),
            Some(utc("2025-01-01T11:00:00Z"))
        );
    }

    #[test]
    fn day_of_week_counts_from_sunday_zero_and_seven_is_sunday_too() {
        // 2025-01-05 is a Sunday.
        let sundays = ["2025-01-05T00:00:00Z", "2025-01-12T00:00:00Z"];
        for expression in ["0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "0 0 * * SUN"] {
            assert_eq!(
                next_n(&schedule(expression), "2025-01-01T00:00:00Z", 2),
                sundays,
                "{expression}"
            );
        }
        // Monday is 1 (the crate would read 1 as Sunday).
        assert_eq!(
            next_n(&schedule("0 0 * * 1"), "2025-01-01T00:00:00Z", 1),
            ["2025-01-06T00:00:00Z"]
        );
        // Friday to Sunday through 7: Fri 3, Sat 4, Sun 5.
        assert_eq!(
            next_n(&schedule("0 0 * * 5-7"), "2025-01-01T00:00:00Z", 4),
            [
                "2025-01-03T00:00:00Z",
                "2025-01-04T00:00:00Z",
                "2025-01-05T00:00:00Z",
                "2025-01-10T00:00:00Z"
            ]
        );
        // Steps over 0-6: Sunday, Wednesday, Saturday.
        assert_eq!(
            next_n(&schedule("0 0 * * */3"), "2025-01-01T00:00:00Z", 3),
            [
                "2025-01-04T00:00:00Z",
                "2025-01-05T00:00:00Z",
                "2025-01-08T00:00:00Z"
            ]
        );
        // Monday to Friday every other day: Mon, Wed, Fri (2025-01-01 is a Wednesday).
        assert_eq!(
            next_n(&schedule("0 0 * * mon-fri/2"), "2025-01-01T00:00:00Z", 3),
            [
                "2025-01-03T00:00:00Z",
                "2025-01-06T00:00:00Z",
                "2025-01-08T00:00:00Z"
            ]
        );
    }

    #[test]
    fn both_day_fields_restricted_means_either_matches() {
        // The 13th, or any Friday: Fri 3, Fri 10, Mon 13, Fri 17.
        assert_eq!(
            next_n(&schedule("0 0 13 * 5"), "2025-01-01T00:00:00Z", 4),
            [
                "2025-01-03T00:00:00Z",
                "2025-01-10T00:00:00Z",
                "2025-01-13T00:00:00Z",
                "2025-01-17T00:00:00Z"
            ]
        );
        // One unrestricted day field: only the other one counts.
        assert_eq!(
            next_n(&schedule("0 0 13 * *"), "2025-01-01T00:00:00Z", 2),
            ["2025-01-13T00:00:00Z", "2025-02-13T00:00:00Z"]
        );
        assert_eq!(
            next_n(&schedule("0 0 ? * 5"), "2025-01-01T00:00:00Z", 2),
            ["2025-01-03T00:00:00Z", "2025-01-10T00:00:00Z"]
        );
        // The latest occurrence follows the union too.
        assert_eq!(
            schedule("0 0 13 * 5").latest_at_or_before(utc("2025-01-16T00:00:00Z")),
            Some(utc("2025-01-13T00:00:00Z"))
        );
    }

    #[test]
    fn malformed_expressions_are_refused_with_the_field_named() {
        assert!(error("0 0 1 * * *", None).contains("has 6 fields"));
        assert!(error("0 0 1 * * * 2025", None).contains("has 7 fields"));
        assert!(error("0 1 * *", None).contains("has 4 fields"));
        assert!(error("60 * * * *", None).contains("minute 60 is out of range 0-59"));
        assert!(error("0 24 * * *", None).contains("hour 24 is out of range 0-23"));
        assert!(error("0 0 0 * *", None).contains("day of month 0 is out of range 1-31"));
        assert!(error("0 0 * 13 *", None).contains("month 13 is out of range 1-12"));
        assert!(error("0 0 * * 8", None).contains("day of week 8 is out of range 0-7"));
        assert!(error("0 0 * * L", None).contains("day of week \"L\" is neither"));
        assert!(error("*/0 * * * *", None).contains("minute step \"0\""));
        assert!(error("0 5-1 * * *", None).contains("goes backwards"));
        assert!(error("0,,1 * * * *", None).contains("empty list element"));
        assert!(error("0 0 30 2 *", None).contains("never runs"));
    }

    #[test]
    fn time_zones_are_iana_names_and_utc_by_default() {
        let paris = Schedule::parse("0 3 * * *", Some("Europe/Paris")).expect("valid");
        // 03:00 in Paris is 02:00 UTC in winter, 01:00 UTC in summer.
        assert_eq!(
            paris.next_after(utc("2025-01-01T00:00:00Z")),
            Some(utc("2025-01-01T02:00:00Z"))
        );
        assert_eq!(
            paris.next_after(utc("2025-07-01T00:00:00Z")),
            Some(utc("2025-07-01T01:00:00Z"))
        );
        assert_eq!(schedule("0 3 * * *").zone(), Tz::UTC);
        let message = error("0 3 * * *", Some("Mars/Olympus_Mons"));
        assert!(
            message.contains("unknown time zone \"Mars/Olympus_Mons\""),
            "{message}"
        );
        assert!(error("0 3 * * *", Some("europe/paris")).contains("unknown time zone"));
    }

    #[test]
    fn a_skipped_local_time_runs_once_when_the_clocks_jump() {
        // Europe/Paris went from 02:00 CET to 03:00 CEST on 2025-03-30 (01:00 UTC).
        let daily = Schedule::parse("30 2 * * *", Some("Europe/Paris")).expect("valid");
        assert_eq!(
            next_n(&daily, "2025-03-29T00:00:00Z", 3),
            [
                "2025-03-29T01:30:00Z", // 02:30 CET
                "2025-03-30T01:00:00Z", // 02:30 does not exist: 03:00 CEST
                "2025-03-31T00:30:00Z"  // 02:30 CEST
            ]
        );
        // Every minute of the skipped hour collapses into one run at 03:00 CEST.
        let minutely = Schedule::parse("* * * * *", Some("Europe/Paris")).expect("valid");
        assert_eq!(
            next_n(&minutely, "2025-03-30T00:58:00Z", 3),
            [
                "2025-03-30T00:59:00Z", // 01:59 CET
                "2025-03-30T01:00:00Z", // 03:00 CEST
                "2025-03-30T01:01:00Z"  // 03:01 CEST
            ]
        );
        assert_eq!(
            minutely.latest_at_or_before(utc("2025-03-30T01:00:30Z")),
            Some(utc("2025-03-30T01:00:00Z"))
        );
    }

    #[test]
    fn a_repeated_local_time_runs_once_at_its_first_occurrence() {
        // America/New_York went from 02:00 EDT back to 01:00 EST on 2025-11-02 (06:00 UTC).
        let daily = Schedule::parse("30 1 * * *", Some("America/New_York")).expect("valid");
        assert_eq!(
            next_n(&daily, "2025-11-01T12:00:00Z", 2),
            [
                "2025-11-02T05:30:00Z", // 01:30 EDT; 01:30 EST (06:30 UTC) does not run
                "2025-11-03T06:30:00Z"  // 01:30 EST
            ]
        );
        // Hourly: 00:00 EDT, 01:00 EDT, then 02:00 EST (01:00 EST is the repeat).
        let hourly = Schedule::parse("0 * * * *", Some("America/New_York")).expect("valid");
        assert_eq!(
            next_n(&hourly, "2025-11-02T03:30:00Z", 3),
            [
                "2025-11-02T04:00:00Z",
                "2025-11-02T05:00:00Z",
                "2025-11-02T07:00:00Z"
            ]
        );
        // During the repeated hour, the latest occurrence is the first pass's, and the next
        // one is after the repeat.
        let in_repeat = utc("2025-11-02T06:45:00Z"); // 01:45 EST
        assert_eq!(
            daily.latest_at_or_before(in_repeat),
            Some(utc("2025-11-02T05:30:00Z"))
        );
        assert_eq!(
            hourly.next_after(in_repeat),
            Some(utc("2025-11-02T07:00:00Z"))
        );
    }
}

//! Names of scheduled backups (pure).
//!
//! A scheduled backup is named from its cluster and its scheduled time in UTC,
//! `<cluster>-<YYYYMMDDHHMM>`: the same (cluster, time) always gives the same name, so that
//! creating it a second time (a retry, a restart, a second manager) answers AlreadyExists
//! instead of making a second backup. Long cluster names are cut with a hash
//! ([`names::child_name`]) so that the name stays a DNS subdomain of at most 253 characters.

use chrono::{DateTime, Utc};

use crate::names::{self, NameKind};

/// The name of `cluster`'s backup scheduled at `at`.
pub fn backup_name(cluster: &str, at: DateTime<Utc>) -> String {
    let suffix = format!("-{}", at.format("%Y%m%d%H%M"));
    names::child_name(
        cluster,
        &suffix,
        NameKind::DnsSubdomain,
        names::DNS_SUBDOMAIN_MAX,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("RFC 3339")
            .with_timezone(&Utc)
    }

    #[test]
    fn the_name_is_the_cluster_and_the_scheduled_minute_in_utc() {
        assert_eq!(
            backup_name("main", at("2025-03-30T03:00:00+02:00")),
            "main-202503300100"
        );
        assert_eq!(
            backup_name("my.db", at("2025-12-31T23:59:00Z")),
            "my.db-202512312359"
        );
    }

    #[test]
    fn the_same_time_gives_the_same_name_and_another_time_another() {
        let t = at("2025-01-01T03:00:00Z");
        assert_eq!(backup_name("main", t), backup_name("main", t));
        assert_ne!(
            backup_name("main", t),
            backup_name("main", at("2025-01-01T03:01:00Z"))
        );
    }

    #[test]
    fn long_cluster_names_give_valid_distinct_names_within_253_characters() {
        let t = at("2025-01-01T03:00:00Z");
        let long = format!("{}.{}", "a".repeat(120), "b".repeat(132));
        assert_eq!(long.len(), 253);
        let name = backup_name(&long, t);
        assert!(name.len() <= names::DNS_SUBDOMAIN_MAX, "{}", name.len());
        assert!(names::is_valid(&name, NameKind::DnsSubdomain), "{name}");
        assert!(name.ends_with("-202501010300"), "{name}");
        let other = format!("{}c", &long[..252]);
        assert_ne!(name, backup_name(&other, t));
        assert_eq!(name, backup_name(&long, t));
    }
}

//! The restore's target check: the server's database must be the one the restore expects (its
//! PostgreSQL system identifier, `--expect-system-identifier`) before anything is dropped or
//! restored. Without an expectation nothing is checked (the restore accepts any database).

use super::error::AgentError;
use super::postgres::Postgres;

/// Checks that the database the server runs has system identifier `expected`, if one is
/// expected; the error names both identifiers.
pub async fn check(postgres: &Postgres, expected: Option<&str>) -> Result<(), AgentError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let found = postgres.system_identifier().await?;
    compare(expected, &found)?;
    tracing::info!(system_identifier = %found, "the target is the expected database");
    Ok(())
}

/// `expected` and `found` name the same database: equal as numbers (so `007` is `7`), or as
/// text when either is not a number.
fn compare(expected: &str, found: &str) -> Result<(), AgentError> {
    let (expected, found) = (expected.trim(), found.trim());
    let same = match (expected.parse::<i128>(), found.parse::<i128>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => expected == found,
    };
    if same {
        Ok(())
    } else {
        Err(AgentError::SystemIdentifierMismatch {
            expected: expected.to_owned(),
            found: found.to_owned(),
        })
    }
}

/// `--expect-system-identifier`'s parser: up to 20 digits, as `pg_control_system()` prints it.
pub fn parse_identifier(text: &str) -> Result<String, String> {
    if (1..=20).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit()) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a PostgreSQL system identifier (1 to 20 digits)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_identifier_passes() {
        assert!(compare("7312345678901234567", "7312345678901234567\n").is_ok());
        assert!(compare("0042", "42").is_ok());
    }

    #[test]
    fn a_mismatch_names_both_identifiers_and_says_nothing_changed() {
        let error = compare("7312345678901234567", "7400000000000000001").expect_err("mismatch");
        assert!(matches!(error, AgentError::SystemIdentifierMismatch { .. }));
        assert_eq!(
            error.to_string(),
            "the target database has system identifier 7400000000000000001, not the expected \
             7312345678901234567: it is not the database this restore was meant for, so \
             nothing was dropped or restored"
        );
        assert_eq!(error.reason(), Some("SystemIdentifierMismatch"));
    }

    #[test]
    fn only_digits_are_an_identifier() {
        assert_eq!(
            parse_identifier("7312345678901234567").as_deref(),
            Ok("7312345678901234567")
        );
        for bad in ["", "Any", "-7", "12 3", "123456789012345678901"] {
            assert!(parse_identifier(bad).is_err(), "{bad:?}");
        }
    }
}

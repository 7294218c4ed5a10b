//! Names derived from user-chosen names, kept within Kubernetes limits.
//!
//! A cluster's name may be up to 253 characters and may contain dots, but its children have
//! stricter rules: Services are DNS-1035 labels (at most 63 characters, starting with a letter),
//! label values are at most 63 characters, and a StatefulSet name is limited to 52 characters
//! because the StatefulSet controller labels every pod with
//! `controller-revision-hash=<statefulset>-<hash of up to 10 characters>`, a label value that
//! must fit in 63 characters (kubernetes/kubernetes#64023). Pods are then `<statefulset>-N`
//! (N < 10 here), which keeps their hostnames within 63 characters too.
//!
//! A name that fits and is valid is used as is. Otherwise it is cut and a short hash of the
//! full original is appended, so two different long names never collide after truncation.

use sha2::{Digest, Sha256};

/// Longest DNS-1035 label: Service names, and label values.
pub const DNS_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain: ConfigMap, Secret, PodDisruptionBudget names.
pub const DNS_SUBDOMAIN_MAX: usize = 253;
/// Longest StatefulSet name whose `controller-revision-hash` pod label still fits in 63
/// characters (`<name>-` plus a hash of up to 10 characters).
pub const STATEFULSET_NAME_MAX: usize = DNS_LABEL_MAX - 11;

/// Characters of the hex hash appended to shortened names.
const HASH_LEN: usize = 8;

/// What a derived name must be valid as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    /// A DNS-1035 label: lowercase letters, digits and `-`, starting with a letter.
    DnsLabel,
    /// A DNS-1123 subdomain: lowercase letters, digits, `-` and `.`, alphanumeric at both ends.
    DnsSubdomain,
}

/// `<base><suffix>`, valid as `kind` and at most `max` characters; shortened with a hash of
/// `base` when it would not be.
pub fn child_name(base: &str, suffix: &str, kind: NameKind, max: usize) -> String {
    let candidate = format!("{base}{suffix}");
    if candidate.len() <= max && is_valid(&candidate, kind) {
        return candidate;
    }
    let hash = short_hash(base);
    // Room left for the part of `base` we keep: `<kept>-<hash><suffix>`.
    let room = max.saturating_sub(suffix.len() + 1 + HASH_LEN);
    let kept = sanitize(base, kind, room);
    let name = if kept.is_empty() {
        format!("{hash}{suffix}")
    } else {
        format!("{kept}-{hash}{suffix}")
    };
    match kind {
        // A label must start with a letter; the hash may start with a digit.
        NameKind::DnsLabel if !name.starts_with(|c: char| c.is_ascii_lowercase()) => {
            let mut prefixed = format!("p{name}");
            prefixed.truncate(max);
            prefixed
        }
        _ => name,
    }
}

/// A label value (at most 63 characters, alphanumeric at both ends) identifying `value`.
pub fn label_value(value: &str) -> String {
    let fits = value.len() <= DNS_LABEL_MAX
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if fits {
        return value.to_owned();
    }
    let kept = sanitize(value, NameKind::DnsSubdomain, DNS_LABEL_MAX - 1 - HASH_LEN);
    let hash = short_hash(value);
    if kept.is_empty() {
        hash
    } else {
        format!("{kept}-{hash}")
    }
}

/// The first `HASH_LEN` hex digits of the SHA-256 of `text`.
pub fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex.truncate(HASH_LEN);
    hex
}

/// The longest prefix (at most `room` characters) of `text` made of allowed characters, with
/// disallowed ones replaced by `-`, and trimmed so it ends alphanumeric.
fn sanitize(text: &str, kind: NameKind, room: usize) -> String {
    let mut kept: String = text
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            '.' if kind == NameKind::DnsSubdomain => c,
            _ => '-',
        })
        .take(room)
        .collect();
    while kept.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        kept.pop();
    }
    let start = kept
        .find(|c: char| match kind {
            NameKind::DnsLabel => c.is_ascii_lowercase(),
            NameKind::DnsSubdomain => c.is_ascii_alphanumeric(),
        })
        .unwrap_or(kept.len());
    kept.split_off(start)
}

/// Whether `name` is a valid name of `kind` (length is checked by the caller).
pub fn is_valid(name: &str, kind: NameKind) -> bool {
    let first_ok = match kind {
        NameKind::DnsLabel => name.starts_with(|c: char| c.is_ascii_lowercase()),
        NameKind::DnsSubdomain => name.starts_with(|c: char| c.is_ascii_alphanumeric()),
    };
    let chars_ok = name.chars().all(|c| match c {
        'a'..='z' | '0'..='9' | '-' => true,
        '.' => kind == NameKind::DnsSubdomain,
        _ => false,
    });
    let parts_ok = kind == NameKind::DnsLabel
        || name.split('.').all(|part| {
            !part.is_empty()
                && part.starts_with(|c: char| c.is_ascii_alphanumeric())
                && part.ends_with(|c: char| c.is_ascii_alphanumeric())
        });
    first_ok && chars_ok && parts_ok && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: &str = "a123456789-123456789-123456789-123456789-123456789-123456789-12";

    #[test]
    fn short_valid_names_are_kept() {
        assert_eq!(
            child_name("main", "-postgresql", NameKind::DnsLabel, DNS_LABEL_MAX),
            "main-postgresql"
        );
        assert_eq!(label_value("main"), "main");
    }

    #[test]
    fn long_names_are_cut_with_a_hash_and_stay_valid() {
        assert_eq!(LONG.len(), 63);
        for (suffix, kind, max) in [
            ("-postgresql", NameKind::DnsLabel, STATEFULSET_NAME_MAX),
            ("-postgresql-headless", NameKind::DnsLabel, DNS_LABEL_MAX),
            (
                "-postgresql-config",
                NameKind::DnsSubdomain,
                DNS_SUBDOMAIN_MAX,
            ),
        ] {
            let name = child_name(LONG, suffix, kind, max);
            assert!(name.len() <= max, "{name} longer than {max}");
            assert!(is_valid(&name, kind), "{name} invalid");
            assert!(name.ends_with(suffix), "{name}");
        }
        let label = label_value(&format!("{LONG}x"));
        assert!(label.len() <= DNS_LABEL_MAX, "{label}");
    }

    #[test]
    fn truncated_names_of_different_inputs_differ() {
        let one = child_name(&format!("{LONG}a"), "-postgresql", NameKind::DnsLabel, 52);
        let two = child_name(&format!("{LONG}b"), "-postgresql", NameKind::DnsLabel, 52);
        assert_ne!(one, two);
    }

    #[test]
    fn names_invalid_as_labels_are_made_valid() {
        for base in ["1db", "my.db", "9.9"] {
            let name = child_name(base, "-postgresql", NameKind::DnsLabel, DNS_LABEL_MAX);
            assert!(is_valid(&name, NameKind::DnsLabel), "{base} -> {name}");
        }
        // Dots are fine in subdomains.
        assert_eq!(
            child_name("my.db", "-postgresql-config", NameKind::DnsSubdomain, 253),
            "my.db-postgresql-config"
        );
        // `my.db` and `my-db` must not share a Service name.
        assert_ne!(
            child_name("my.db", "-postgresql", NameKind::DnsLabel, DNS_LABEL_MAX),
            child_name("my-db", "-postgresql", NameKind::DnsLabel, DNS_LABEL_MAX)
        );
    }
}

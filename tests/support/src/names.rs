//! Unique, DNS-label-safe names for per-test resources.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest name Kubernetes accepts for a namespace (a DNS label); also fine for databases.
const MAX_NAME_LEN: usize = 63;

/// `prefix-<random>`: lowercase, `[a-z0-9-]` only, at most 63 characters.
pub fn unique_name(prefix: &str) -> String {
    let suffix = format!("{:012x}", random_u64() & 0xffff_ffff_ffff);
    let clean: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let room = MAX_NAME_LEN - suffix.len() - 1;
    let clean = clean.trim_matches('-');
    let clean = if clean.is_empty() { "test" } else { clean };
    let head = clean[..clean.len().min(room)].trim_end_matches('-');
    format!("{head}-{suffix}")
}

/// Random enough for test names without a dependency: std's hasher keys are randomly seeded per
/// `RandomState`, and a counter makes two calls in the same instant differ.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_and_unique() {
        let a = unique_name("My_Test");
        let b = unique_name("My_Test");
        assert_ne!(a, b);
        assert!(a.starts_with("my-test-"), "{a}");
        let long = unique_name(&"x".repeat(100));
        assert!(long.len() <= MAX_NAME_LEN, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }
}

//! PostgreSQL's memory settings from the memory the container gets: `shared_buffers` is a
//! quarter of it and `effective_cache_size` three quarters, the usual starting point. The
//! memory is the container's limit, else its request; without either, PostgreSQL's defaults
//! stay (128MB of shared buffers), since nothing says how much the pod may use.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const MIB: u64 = 1024 * 1024;
/// Below this, shared buffers would starve the server whatever the container has.
const MIN_SHARED_BUFFERS_MIB: u64 = 16;

/// Memory settings, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    pub shared_buffers_mib: u64,
    pub effective_cache_size_mib: Option<u64>,
}

impl MemorySettings {
    /// The settings for a container with these resources.
    pub fn for_resources(resources: Option<&ResourceRequirements>) -> MemorySettings {
        let memory = resources.and_then(|r| {
            let limit = r.limits.as_ref().and_then(|l| l.get("memory"));
            let request = r.requests.as_ref().and_then(|l| l.get("memory"));
            limit.or(request).and_then(quantity_bytes)
        });
        match memory {
            Some(bytes) => MemorySettings {
                shared_buffers_mib: (bytes / 4 / MIB).max(MIN_SHARED_BUFFERS_MIB),
                effective_cache_size_mib: Some((bytes / 4 * 3 / MIB).max(MIN_SHARED_BUFFERS_MIB)),
            },
            None => MemorySettings {
                shared_buffers_mib: 128,
                effective_cache_size_mib: None,
            },
        }
    }

    /// The settings as postgresql.conf lines.
    pub fn config_lines(&self) -> String {
        let mut lines = format!("shared_buffers = {}MB\n", self.shared_buffers_mib);
        if let Some(cache) = self.effective_cache_size_mib {
            lines.push_str(&format!("effective_cache_size = {cache}MB\n"));
        }
        lines
    }
}

/// Bytes of a Kubernetes memory quantity (`512Mi`, `1G`, `1.5Gi`, `1e9`, `1048576`); `None`
/// when it is not one.
pub fn quantity_bytes(quantity: &Quantity) -> Option<u64> {
    let text = quantity.0.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "m" => 1e-3,
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    let bytes = number * multiplier;
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn resources(limit: Option<&str>, request: Option<&str>) -> ResourceRequirements {
        let memory = |value: Option<&str>| {
            value.map(|v| BTreeMap::from([("memory".to_owned(), Quantity(v.to_owned()))]))
        };
        ResourceRequirements {
            limits: memory(limit),
            requests: memory(request),
            ..ResourceRequirements::default()
        }
    }

    #[test]
    fn a_quarter_of_the_limit_for_shared_buffers_and_three_quarters_for_the_cache() {
        let settings = MemorySettings::for_resources(Some(&resources(Some("2Gi"), Some("1Gi"))));
        assert_eq!(settings.shared_buffers_mib, 512);
        assert_eq!(settings.effective_cache_size_mib, Some(1536));
        assert_eq!(
            settings.config_lines(),
            "shared_buffers = 512MB\neffective_cache_size = 1536MB\n"
        );
    }

    #[test]
    fn the_request_counts_when_there_is_no_limit() {
        let settings = MemorySettings::for_resources(Some(&resources(None, Some("1G"))));
        assert_eq!(settings.shared_buffers_mib, 238);
    }

    #[test]
    fn without_memory_postgresql_s_default_stays() {
        for resources in [None, Some(resources(None, None))] {
            let settings = MemorySettings::for_resources(resources.as_ref());
            assert_eq!(settings.config_lines(), "shared_buffers = 128MB\n");
        }
    }

    #[test]
    fn a_tiny_container_still_gets_16mb_of_shared_buffers() {
        let settings = MemorySettings::for_resources(Some(&resources(Some("32Mi"), None)));
        assert_eq!(settings.shared_buffers_mib, 16);
    }

    #[test]
    fn quantities_in_every_notation() {
        let bytes = |q: &str| quantity_bytes(&Quantity(q.to_owned()));
        assert_eq!(bytes("512Mi"), Some(512 * MIB));
        assert_eq!(bytes("1.5Gi"), Some(1536 * MIB));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1e9"), Some(1_000_000_000));
        assert_eq!(bytes("1048576"), Some(MIB));
        assert_eq!(bytes("lots"), None);
        assert_eq!(bytes("12Qi"), None);
    }
}

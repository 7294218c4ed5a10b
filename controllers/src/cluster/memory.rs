//! PostgreSQL's memory settings from the memory the container gets: `shared_buffers` is a
//! quarter of it and `effective_cache_size` three quarters, the usual starting point. The
//! memory is the container's limit, else its request; without either, PostgreSQL's defaults
//! stay (128MB of shared buffers), since nothing says how much the pod may use.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

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

/// Bytes of a memory quantity; `None` when it is not one (or is negative).
fn quantity_bytes(quantity: &Quantity) -> Option<u64> {
    quantity::parse(&quantity.0)
        .filter(|bytes| *bytes >= 0.0)
        .map(|bytes| bytes as u64)
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
    fn a_memory_quantity_that_is_not_one_leaves_the_default() {
        let settings = MemorySettings::for_resources(Some(&resources(Some("lots"), None)));
        assert_eq!(settings.config_lines(), "shared_buffers = 128MB\n");
    }
}

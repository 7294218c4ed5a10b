//! How a backup compresses its dumps: `--compression zstd|gzip|none` and `--compression-level`.
//!
//! - `zstd` (the default): `pg_dump -Fc --compress=0` writes an uncompressed archive and the agent
//!   compresses the stream itself with zstd on `--compression-workers` threads (libzstd's
//!   multi-threaded mode), by default as many as the CPUs the container may use. pg_dump's own
//!   zlib is single-threaded and was most of a backup's time; the object is then a zstd frame
//!   around a custom-format archive, and the manifest says so (`"compression": "zstd"`).
//! - `gzip`: pg_dump compresses inside its archive (`--compress=LEVEL`, pg_dump's default level
//!   when none is given) and the agent stores the archive as it comes (`"compression": "none"`).
//! - `none`: `pg_dump --compress=0`, stored as it comes.
//!
//! `--dump-compression LEVEL` (0-9), the flag that came first, still means `gzip` at that level
//! (0: `none`); it cannot be combined with `--compression` or `--compression-level`.
//!
//! The manifest records the compression of every object as stored; a manifest without it (every
//! backup made before the agent compressed) means `none`, and a backup with zstd objects gets
//! manifest version 2, which agents from before zstd refuse before changing anything
//! ([`pgkube_controllers::storage::manifest`]).

use std::path::Path;

use clap::{Args, ValueEnum};

use super::error::AgentError;

/// zstd's level when `--compression-level` is not given. In `cargo bench --bench
/// agent_throughput` (figures in docs/benchmarks.md), level 1 is both the fastest and the
/// smallest where compressing costs time, and meets every target on the mixed data set, where
/// level 3 stores a little less but restores too slowly from 1.25 GB up.
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;
/// Largest level accepted: zstd's 20-22 ("ultra") need windows of 32 MiB and more per worker.
pub const MAX_ZSTD_LEVEL: i64 = 19;
/// Largest level pg_dump's gzip takes.
const MAX_GZIP_LEVEL: i32 = 9;
/// Most compression threads accepted.
const MAX_WORKERS: i64 = 64;

/// The `--compression` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// pg_dump writes no compression; the agent compresses with multi-threaded zstd.
    Zstd,
    /// pg_dump's own gzip inside the archive (single-threaded).
    Gzip,
    /// No compression at all.
    None,
}

/// The compression flags of `pgkube agent backup`.
#[derive(Args, Debug, Clone)]
pub struct CompressionArgs {
    /// How dumps are compressed: zstd (by the agent, on several threads), gzip (by pg_dump,
    /// single-threaded) or none.
    #[arg(long, env = "PGKUBE_COMPRESSION", value_enum, default_value_t = Method::Zstd,
          conflicts_with = "dump_compression")]
    compression: Method,

    /// Compression level: 1 (fastest) to 19 (smallest) for zstd, 1 to 9 for gzip, none for
    /// `none`. Default: 1 for zstd (see docs/benchmarks.md), pg_dump's for gzip.
    #[arg(long, env = "PGKUBE_COMPRESSION_LEVEL", value_name = "LEVEL",
          value_parser = clap::value_parser!(i64).range(1..=MAX_ZSTD_LEVEL),
          conflicts_with = "dump_compression")]
    compression_level: Option<i64>,

    /// Threads that compress with zstd. Default: the CPUs the container may use (its cgroup
    /// CPU quota, else the CPUs the process may run on).
    #[arg(long, env = "PGKUBE_COMPRESSION_WORKERS", value_name = "N",
          value_parser = clap::value_parser!(i64).range(1..=MAX_WORKERS))]
    compression_workers: Option<i64>,

    /// pg_dump's gzip level, 0 (none) to 9: the same as `--compression gzip --compression-level
    /// LEVEL` (0: `--compression none`). Kept for the scripts that use it.
    #[arg(long, env = "PGKUBE_DUMP_COMPRESSION", value_name = "LEVEL",
          value_parser = clap::value_parser!(u8).range(0..=9))]
    dump_compression: Option<u8>,
}

/// What the flags resolve to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `pg_dump --compress=0`, compressed by the agent.
    Zstd(ZstdSettings),
    /// `pg_dump --compress=LEVEL` (`None`: pg_dump's default), stored as it comes.
    PgDump(Option<u8>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZstdSettings {
    pub level: i32,
    pub workers: u32,
}

impl CompressionArgs {
    /// The plan, with the container's CPUs as the default worker count.
    pub fn plan(&self) -> Result<Plan, AgentError> {
        self.plan_with(container_cpus)
    }

    fn plan_with(&self, cpus: impl Fn() -> u32) -> Result<Plan, AgentError> {
        if let Some(level) = self.dump_compression {
            return Ok(Plan::PgDump(Some(level)));
        }
        let level = self.compression_level;
        match self.compression {
            Method::Zstd => Ok(Plan::Zstd(ZstdSettings {
                // Within 1..=19, checked by clap.
                level: level.map_or(DEFAULT_ZSTD_LEVEL, |level| level as i32),
                workers: self
                    .compression_workers
                    .map_or_else(cpus, |workers| workers as u32),
            })),
            Method::Gzip => match level {
                Some(level) if level > i64::from(MAX_GZIP_LEVEL) => Err(AgentError::Settings(
                    format!("--compression-level {level} is out of range for gzip (1-9)"),
                )),
                level => Ok(Plan::PgDump(level.map(|level| level as u8))),
            },
            Method::None if level.is_some() => Err(AgentError::Settings(
                "--compression-level has no meaning with --compression none".into(),
            )),
            Method::None => Ok(Plan::PgDump(Some(0))),
        }
    }
}

impl Plan {
    /// The `--compress` argument pg_dump gets, if any.
    pub fn pg_dump_compress(self) -> Option<u8> {
        match self {
            Self::Zstd(_) => Some(0),
            Self::PgDump(level) => level,
        }
    }

    /// The zstd settings, when the agent compresses.
    pub fn zstd(self) -> Option<ZstdSettings> {
        match self {
            Self::Zstd(settings) => Some(settings),
            Self::PgDump(_) => None,
        }
    }
}

/// The CPUs the container may use: its cgroup v2 `cpu.max` quota rounded up, never more than the
/// CPUs the process may run on (`available_parallelism`, which also honours CPU affinity).
pub fn container_cpus() -> u32 {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let quota = std::fs::read_to_string(Path::new("/sys/fs/cgroup/cpu.max"))
        .ok()
        .and_then(|content| cpus_of_quota(&content));
    let cpus = quota.map_or(available, |quota| quota.min(available));
    u32::try_from(cpus).unwrap_or(1).max(1)
}

/// `cpu.max` is `"<quota> <period>"` in microseconds, or `"max <period>"` for no limit.
fn cpus_of_quota(content: &str) -> Option<usize> {
    let mut fields = content.split_whitespace();
    let quota: u64 = fields.next()?.parse().ok()?;
    let period: u64 = fields.next()?.parse().ok()?;
    if period == 0 {
        return None;
    }
    usize::try_from(quota.div_ceil(period).max(1)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        compression: CompressionArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, AgentError> {
        let cli = Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied()))
            .expect("flags parse");
        cli.compression.plan_with(|| 3)
    }

    fn refusal(args: &[&str]) -> String {
        match Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied())) {
            Ok(_) => panic!("{args:?} was accepted"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn zstd_at_level_1_on_the_container_cpus_is_the_default() {
        let expected = Plan::Zstd(ZstdSettings {
            level: 1,
            workers: 3,
        });
        assert_eq!(plan(&[]).expect("plan"), expected);
        assert_eq!(expected.pg_dump_compress(), Some(0));
    }

    #[test]
    fn level_and_workers_are_taken_as_given() {
        let settings = plan(&["--compression-level", "9", "--compression-workers", "1"])
            .expect("plan")
            .zstd();
        assert_eq!(
            settings,
            Some(ZstdSettings {
                level: 9,
                workers: 1
            })
        );
    }

    #[test]
    fn gzip_and_none_leave_the_compression_to_pg_dump() {
        assert_eq!(
            plan(&["--compression", "gzip"]).expect("gzip"),
            Plan::PgDump(None)
        );
        assert_eq!(
            plan(&["--compression", "gzip", "--compression-level", "6"]).expect("gzip 6"),
            Plan::PgDump(Some(6))
        );
        assert_eq!(
            plan(&["--compression", "none"]).expect("none"),
            Plan::PgDump(Some(0))
        );
        assert_eq!(
            plan(&["--dump-compression", "1"]).expect("old flag"),
            Plan::PgDump(Some(1))
        );
    }

    #[test]
    fn levels_out_of_range_are_refused_naming_the_flag() {
        for level in ["0", "20", "-1"] {
            let message = refusal(&[&format!("--compression-level={level}")]);
            assert!(message.contains("--compression-level"), "{message}");
        }
        let message = refusal(&["--dump-compression", "10"]);
        assert!(message.contains("--dump-compression"), "{message}");
        let message = refusal(&["--compression-workers", "0"]);
        assert!(message.contains("--compression-workers"), "{message}");
        let error = plan(&["--compression", "gzip", "--compression-level", "12"])
            .expect_err("gzip stops at 9");
        assert!(
            error.to_string().contains("--compression-level 12"),
            "{error}"
        );
        let error = plan(&["--compression", "none", "--compression-level", "3"])
            .expect_err("none has no level");
        assert!(error.to_string().contains("--compression-level"), "{error}");
    }

    #[test]
    fn the_old_flag_does_not_combine_with_the_new_ones() {
        let message = refusal(&["--dump-compression", "5", "--compression", "zstd"]);
        assert!(message.contains("--dump-compression"), "{message}");
    }

    #[test]
    fn a_cgroup_quota_is_rounded_up_to_whole_cpus() {
        assert_eq!(cpus_of_quota("150000 100000\n"), Some(2));
        assert_eq!(cpus_of_quota("50000 100000"), Some(1));
        assert_eq!(cpus_of_quota("400000 100000"), Some(4));
        assert_eq!(cpus_of_quota("max 100000"), None);
        assert_eq!(cpus_of_quota(""), None);
        assert!(container_cpus() >= 1);
    }
}

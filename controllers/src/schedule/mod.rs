//! The cron engine: scheduled PostgreSQLBackups.
//!
//! For each cluster with `spec.backup` (and not `suspend`), the engine creates a
//! PostgreSQLBackup at each time of the schedule, named from the cluster and that time so that
//! a retry, a restart or a second manager never makes two, unless the cluster's previous backup
//! or a restore into it is unfinished, or no storage is set (a skip, with an Event and the
//! `pgkube_backup_skipped_ticks_total` metric). After downtime, at most one missed time is
//! caught up. The cluster's status shows `lastScheduledBackup`, `nextScheduledBackup` and the
//! `BackupScheduled` condition, written under the engine's own field manager
//! ([`FIELD_MANAGER`]) so that the cluster controller's status fields are left alone.
//!
//! - [`parse`]: cron expressions and time zones, occurrences, DST (pure);
//! - [`name`]: the scheduled backups' names (pure);
//! - [`plan`]: what is due, what a due time does, the backup and the status fields (pure);
//! - [`engine`]: watches, timers and writes ([`BackupScheduler`]), which [`crate::run`] runs.

pub mod engine;
pub mod name;
pub mod parse;
pub mod plan;

pub use engine::{BackupScheduler, FIELD_MANAGER};
pub use parse::{Schedule, ScheduleError};
pub use plan::CONDITION;

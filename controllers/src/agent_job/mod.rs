//! The Jobs that run `pgkube agent backup` and `pgkube agent restore`: how they are built
//! ([`build`], pure), whether their agent started ([`start`], pure), how their end is read
//! ([`follow`], pure), and the calls that create and read them. The backup and restore
//! controllers share them, so the two kinds of Job stay alike.

pub mod build;
pub mod follow;
mod inputs;
mod live;
pub mod progress;
pub mod start;

pub use build::{
    BACKUP_CONTAINER, BACKUP_LABEL, JobInput, RESTORE_CONTAINER, RESTORE_LABEL, Task, build,
    job_name, restore_job_name,
};
pub use follow::{AgentResult, JobFailure, JobState, has_ended, job_state};
pub use inputs::s3_sources;
pub use live::{JobError, create, delete, own_jobs, progress_to_write, running_progress, state};
pub use progress::{AgentProgress, human_bytes, progress_due};
pub use start::{NotStarted, StartDeadline};

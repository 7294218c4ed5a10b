//! Following a backup or restore Job to its end (pure): the Job's conditions say whether it ended, and
//! the agent's result line in its pod's termination message says how. Before that, its pod says
//! whether the agent started ([`super::start`]).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::start::{self, NotStarted};

/// The agent's result line (`pgkube agent backup` and `restore` print it and write it to the
/// termination message), the fields the controllers read.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentResult {
    /// `Completed` or `Failed`.
    pub status: String,
    pub message: Option<String>,
    /// Why it failed, as a reason the controllers know (for example
    /// `SystemIdentifierMismatch`), when the agent gives one.
    pub reason: Option<String>,
    pub backup_name: Option<String>,
    pub manifest_key: Option<String>,
    /// Hex SHA-256 of the manifest's bytes.
    pub manifest_sha256: Option<String>,
    pub postgresql_version: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub size: Option<u64>,
    /// The databases restored (restores only; left out when the line would be too long).
    pub databases: Option<Vec<String>>,
}

impl AgentResult {
    /// The result in a termination message, if the message is one (it is the end of the log
    /// instead when the agent crashed before writing it).
    pub fn parse(message: &str) -> Option<Self> {
        serde_json::from_str(message.trim()).ok()
    }
}

/// Where a backup or restore Job stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Its pod has not started the agent yet, and why; `created` is when the Job was created,
    /// which the start timeout counts from.
    Starting {
        why: NotStarted,
        created: Option<Timestamp>,
    },
    /// The agent started and has not finished yet.
    Running,
    /// Succeeded; the agent's result, when it could be read.
    Succeeded(Option<Box<AgentResult>>),
    /// Failed, and why.
    Failed(JobFailure),
}

/// Why a Job failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobFailure {
    /// The agent's reason, when its result gives one.
    pub reason: Option<String>,
    /// What failed, in one line.
    pub message: String,
}

impl JobFailure {
    /// A failure with a message only.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            reason: None,
            message: message.into(),
        }
    }
}

/// Whether the Job has ended (its Complete or Failed condition is True): only then are its
/// pods' termination messages worth reading.
pub fn has_ended(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// The state of `job`, from its conditions and its pods: whether the agent started, and the
/// termination messages for the details of its end.
pub fn job_state(job: &Job, pods: &[Pod]) -> JobState {
    let conditions = job
        .status
        .as_ref()
        .and_then(|status| status.conditions.clone())
        .unwrap_or_default();
    let is_true = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if is_true("Complete").is_some() {
        let result = termination_message(pods)
            .and_then(|m| AgentResult::parse(&m))
            .map(Box::new);
        return JobState::Succeeded(result);
    }
    if let Some(failed) = is_true("Failed") {
        return JobState::Failed(failure_reason(
            failed.reason.as_deref(),
            failed.message.as_deref(),
            termination_message(pods).as_deref(),
        ));
    }
    match start::not_started(pods) {
        Some(why) => JobState::Starting {
            why,
            created: job.metadata.creation_timestamp.as_ref().map(|t| t.0),
        },
        None => JobState::Running,
    }
}

/// Why a Job failed: the agent's own message (and reason) when it wrote one, else the end of
/// its log (the fallback termination message), else the Job controller's reason (for example
/// `DeadlineExceeded`).
fn failure_reason(
    reason: Option<&str>,
    message: Option<&str>,
    termination: Option<&str>,
) -> JobFailure {
    if let Some(termination) = termination.map(str::trim).filter(|m| !m.is_empty()) {
        return match AgentResult::parse(termination) {
            Some(AgentResult {
                message: Some(message),
                reason,
                ..
            }) => JobFailure { reason, message },
            _ => JobFailure::new(last_lines(termination)),
        };
    }
    JobFailure::new(match (reason, message) {
        (Some(reason), Some(message)) => format!("{reason}: {message}"),
        (Some(reason), None) => reason.to_owned(),
        (None, Some(message)) => message.to_owned(),
        (None, None) => "the Job failed".to_owned(),
    })
}

/// The last three lines of a log, joined, at most 512 characters.
fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    let mut end = tail.len().min(512);
    while !tail.is_char_boundary(end) {
        end -= 1;
    }
    tail[..end].to_owned()
}

/// The termination message of the agent's container (the pod's only one; init containers have
/// their own statuses) of the newest terminated pod.
fn termination_message(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            let terminated = statuses
                .iter()
                .find_map(|s| s.state.as_ref()?.terminated.as_ref())?;
            Some((terminated.finished_at.clone(), terminated.message.clone()?))
        })
        .max_by(|a, b| a.0.as_ref().map(|t| t.0).cmp(&b.0.as_ref().map(|t| t.0)))
        .map(|(_, message)| message)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    use super::*;

    fn job(condition: Option<(&str, &str, &str)>) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: condition.map(|(type_, reason, message)| {
                    vec![JobCondition {
                        type_: type_.to_owned(),
                        status: "True".to_owned(),
                        reason: Some(reason.to_owned()),
                        message: Some(message.to_owned()),
                        ..JobCondition::default()
                    }]
                }),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    fn pod(message: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "backup".to_owned(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            message: Some(message.to_owned()),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    const COMPLETED: &str = r#"{"status":"Completed","backupName":"b1","manifestKey":"db/main/b1/manifest.json","manifestSha256":"ab12","postgresqlVersion":"15.14","startedAt":"2026-11-30T10:00:00Z","finishedAt":"2026-11-30T10:01:00Z","size":4242,"databaseCount":2}"#;

    #[test]
    fn a_job_without_an_end_condition_is_starting_then_running() {
        let JobState::Starting { why, .. } = job_state(&job(None), &[]) else {
            panic!("no pod yet: starting");
        };
        assert_eq!(why.reason, start::NO_POD);
        let mut running = pod("");
        if let Some(status) = running.status.as_mut() {
            status.phase = Some("Running".to_owned());
        }
        assert_eq!(job_state(&job(None), &[running]), JobState::Running);
        assert!(!has_ended(&job(None)));
        assert!(has_ended(&job(Some(("Complete", "", "")))));
        assert!(has_ended(&job(Some(("Failed", "DeadlineExceeded", "")))));
    }

    #[test]
    fn a_complete_job_carries_the_agents_result() {
        let JobState::Succeeded(Some(result)) =
            job_state(&job(Some(("Complete", "", ""))), &[pod(COMPLETED)])
        else {
            panic!("succeeded with a result");
        };
        assert_eq!(
            result.manifest_key.as_deref(),
            Some("db/main/b1/manifest.json")
        );
        assert_eq!(result.size, Some(4242));
        assert_eq!(result.postgresql_version.as_deref(), Some("15.14"));
    }

    #[test]
    fn a_failed_job_says_why_from_the_agent_then_the_log_then_the_job() {
        let failed = job(Some((
            "Failed",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        )));
        let agent = r#"{"status":"Failed","message":"S3 CreateMultipartUpload of db/main/b1/globals.sql failed: InvalidAccessKeyId"}"#;
        assert_eq!(
            job_state(&failed, &[pod(agent)]),
            JobState::Failed(JobFailure::new(
                "S3 CreateMultipartUpload of db/main/b1/globals.sql failed: InvalidAccessKeyId"
            ))
        );
        let log = "starting\nline two\npanicked at src/x.rs\nthread main aborted\n";
        assert_eq!(
            job_state(&failed, &[pod(log)]),
            JobState::Failed(JobFailure::new(
                "line two | panicked at src/x.rs | thread main aborted"
            ))
        );
        let deadline = job(Some((
            "Failed",
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        )));
        assert_eq!(
            job_state(&deadline, &[]),
            JobState::Failed(JobFailure::new(
                "DeadlineExceeded: Job was active longer than specified deadline"
            ))
        );
    }

    #[test]
    fn a_failed_job_carries_the_agents_reason_when_it_gives_one() {
        let failed = job(Some(("Failed", "BackoffLimitExceeded", "")));
        let agent = r#"{"status":"Failed","reason":"SystemIdentifierMismatch","message":"the target database has system identifier 1, not the expected 2"}"#;
        assert_eq!(
            job_state(&failed, &[pod(agent)]),
            JobState::Failed(JobFailure {
                reason: Some("SystemIdentifierMismatch".to_owned()),
                message: "the target database has system identifier 1, not the expected 2"
                    .to_owned(),
            })
        );
    }
}

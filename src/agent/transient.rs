//! Another few attempts, minutes apart rather than seconds, for an upload request that failed
//! with a transient error after the SDK's own retries.
//!
//! Why: the SDK retries each request `--s3-max-attempts` times with a backoff of at most a few
//! seconds in all, and its retry quota runs dry when many requests fail at once, so a store that
//! restarts or a load balancer that fails over for half a minute would fail a backup that had
//! been streaming for hours, and with it the schedule's run. A part is a `Bytes` buffer in
//! memory, so sending it again costs nothing but the wait. Only transient failures (a timeout,
//! no connection, a broken answer, 5xx, 429, `SlowDown`, `RequestTimeout`) are tried again: a
//! refusal (bad keys, no bucket) fails as fast as before.

use std::future::Future;
use std::time::Duration;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use tracing::warn;

use super::storage::{error_chain, one_line};

/// The waits before each extra attempt of a part: together about a minute of store outage
/// survived, on top of the SDK's own retries.
pub const PART_RETRY_WAITS: [Duration; 3] = [
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(40),
];

/// The waits before the first `retries` extra attempts of a part (all of them at most).
pub fn part_waits(retries: usize) -> &'static [Duration] {
    &PART_RETRY_WAITS[..retries.min(PART_RETRY_WAITS.len())]
}

/// S3 error codes that say "try again later", whatever the HTTP status.
const TRANSIENT_CODES: [&str; 6] = [
    "SlowDown",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
];

/// Whether the SDK's error is worth another attempt later.
pub fn is_transient<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> bool {
    match error {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            transient_answer(service.raw().status().as_u16(), service.err().code())
        }
        // The request could not even be built: the same again would fail the same way.
        _ => false,
    }
}

/// Whether an answer of the store (its HTTP status and S3 error code) is a transient failure.
fn transient_answer(status: u16, code: Option<&str>) -> bool {
    status >= 500 || status == 429 || code.is_some_and(|code| TRANSIENT_CODES.contains(&code))
}

/// `attempt`, then again after each of `waits` while it fails with an error that `transient`
/// accepts; the last error otherwise. `what` names the request in the log.
pub async fn retried<T, E, F, Fut>(
    what: &str,
    waits: &[Duration],
    transient: impl Fn(&E) -> bool,
    mut attempt: F,
) -> Result<T, E>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    for (round, wait) in waits.iter().enumerate() {
        match attempt().await {
            Err(error) if transient(&error) => {
                warn!(
                    request = what,
                    round = round + 1,
                    wait_seconds = wait.as_secs_f64(),
                    "transient store error after the client's retries ({}); trying again",
                    one_line(&error_chain(&error))
                );
                tokio::time::sleep(*wait).await;
            }
            done => return done,
        }
    }
    attempt().await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A store's answer, by its HTTP status.
    #[derive(Debug, PartialEq, thiserror::Error)]
    #[error("HTTP {0}")]
    struct Answer(u16);

    fn unavailable(answer: &Answer) -> bool {
        answer.0 == 503
    }

    #[test]
    fn server_failures_and_throttling_are_transient_refusals_are_not() {
        assert!(transient_answer(503, None));
        assert!(transient_answer(500, Some("InternalError")));
        assert!(transient_answer(429, None));
        assert!(transient_answer(400, Some("RequestTimeout")));
        assert!(transient_answer(200, Some("SlowDown")));
        assert!(!transient_answer(403, Some("InvalidAccessKeyId")));
        assert!(!transient_answer(404, Some("NoSuchUpload")));
        assert!(!transient_answer(400, None));
    }

    #[test]
    fn timeouts_and_lost_connections_are_transient_a_request_not_built_is_not() {
        let timeout: SdkError<aws_sdk_s3::operation::upload_part::UploadPartError, HttpResponse> =
            SdkError::timeout_error("read timed out");
        assert!(is_transient(&timeout));
        let unbuilt: SdkError<aws_sdk_s3::operation::upload_part::UploadPartError, HttpResponse> =
            SdkError::construction_failure("no body");
        assert!(!is_transient(&unbuilt));
    }

    const NO_WAIT: [Duration; 3] = [Duration::ZERO; 3];

    #[test]
    fn part_retries_take_the_first_waits_and_never_more_than_there_are() {
        assert!(part_waits(0).is_empty());
        assert_eq!(part_waits(1), [Duration::from_secs(5)]);
        assert_eq!(part_waits(9), PART_RETRY_WAITS);
    }

    #[tokio::test]
    async fn a_transient_failure_is_tried_again_until_it_works() {
        let calls = Cell::new(0);
        let result = retried("UploadPart", &NO_WAIT, unavailable, || {
            calls.set(calls.get() + 1);
            let outcome = if calls.get() < 3 {
                Err(Answer(503))
            } else {
                Ok(7)
            };
            async move { outcome }
        })
        .await;
        assert_eq!(result, Ok(7));
        assert_eq!(calls.get(), 3);
    }

    #[tokio::test]
    async fn a_refusal_fails_at_once_and_a_lasting_outage_after_the_last_wait() {
        let calls = Cell::new(0);
        let refused: Result<u8, Answer> = retried("UploadPart", &NO_WAIT, unavailable, || {
            calls.set(calls.get() + 1);
            async { Err(Answer(403)) }
        })
        .await;
        assert_eq!((refused, calls.get()), (Err(Answer(403)), 1));

        calls.set(0);
        let down: Result<u8, Answer> = retried("UploadPart", &NO_WAIT, unavailable, || {
            calls.set(calls.get() + 1);
            async { Err(Answer(503)) }
        })
        .await;
        assert_eq!(
            (down, calls.get()),
            (Err(Answer(503)), 4),
            "bounded: 1 + 3 waits"
        );
    }
}

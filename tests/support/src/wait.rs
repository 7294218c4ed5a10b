//! Polling until a condition holds, with a clear message when it never does.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long to sleep between two probes.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Calls `probe` until it returns `Ok(Some(value))`, then returns the value.
///
/// `Ok(None)` means "not yet"; `Err` is remembered and polling goes on (the API server may say
/// "not found" before an object appears). On timeout the error reads
/// `timed out after 30s waiting for <description>; last: <last error or "not ready yet">`.
pub async fn wait_until<T, F, Fut>(
    description: &str,
    timeout: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => String::from("not ready yet"),
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {}s waiting for {description}; last: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_ready() {
        let mut calls = 0;
        let value = wait_until("the third call", Duration::from_secs(5), || {
            calls += 1;
            let ready = calls >= 3;
            async move { Ok(ready.then_some(42)) }
        })
        .await
        .expect("ready");
        assert_eq!(value, 42);
    }

    #[tokio::test]
    async fn timeout_names_the_condition_and_last_error() {
        let error = wait_until::<(), _, _>("a miracle", Duration::from_millis(300), || async {
            anyhow::bail!("still nothing")
        })
        .await
        .expect_err("must time out");
        let message = error.to_string();
        assert!(message.contains("waiting for a miracle"), "{message}");
        assert!(message.contains("last: still nothing"), "{message}");
    }
}

//! Client-side rate limit of requests to the Kubernetes API server (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket (GCRA, from the governor crate) as a tower layer in the
//! kube client's service stack.
//!
//! The wait happens in `poll_ready`, so a request only reaches the inner service once it holds
//! a token. kube's `Client` drives the stack through a buffer: requests beyond the rate queue
//! there in order instead of failing.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::Clock as _;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{Layer, Service};

/// A tower layer that lets requests through at `qps` per second with bursts of `burst`.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// `qps` must be positive and finite, `burst` at least 1 (the flags are validated so).
    pub fn new(qps: f64, burst: NonZeroU32) -> Self {
        // One token every 1/qps seconds; the bucket holds `burst` tokens.
        let period = Duration::from_secs_f64(1.0 / qps).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Self {
            limiter: Arc::new(RateLimiter::direct(quota)),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: Arc::clone(&self.limiter),
            waiting: None,
            holds_token: false,
        }
    }
}

type TokenFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The service made by [`RateLimitLayer`].
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    /// The wait for the next token, kept across polls.
    waiting: Option<TokenFuture>,
    /// A token was taken by `poll_ready` and not yet spent by `call`.
    holds_token: bool,
}

impl<S, Request> Service<Request> for RateLimited<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.holds_token {
            let limiter = Arc::clone(&self.limiter);
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(take_token(limiter)));
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waiting = None;
            self.holds_token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.holds_token = false;
        self.inner.call(request)
    }
}

/// Waits until `limiter` lets one request through, taking its token. On a tokio timer rather
/// than governor's `until_ready`, whose timer runs on a thread of its own (futures-timer's)
/// that every wait had to wake: about 2% of the manager's CPU samples while it converged 1,000
/// clusters with its limiter full.
async fn take_token(limiter: Arc<DefaultDirectRateLimiter>) {
    while let Err(not_until) = limiter.check() {
        let wait = not_until.wait_time_from(limiter.clock().now());
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    fn echo() -> impl Service<u32, Response = u32, Error = Infallible> {
        tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) })
    }

    #[tokio::test]
    async fn a_burst_passes_and_the_next_request_waits_for_a_token() {
        // One token an hour: after the burst of 3, the fourth request cannot get through.
        let layer = RateLimitLayer::new(1.0 / 3600.0, NonZeroU32::new(3).expect("non-zero"));
        let mut service = layer.layer(echo());
        for n in 0..3 {
            let answer = service.ready().await.expect("ready").call(n).await;
            assert_eq!(answer, Ok(n));
        }
        let fourth = tokio::time::timeout(Duration::from_millis(300), service.ready()).await;
        assert!(fourth.is_err(), "the fourth request got through the limit");
    }

    #[tokio::test]
    async fn services_from_one_layer_share_the_bucket() {
        let layer = RateLimitLayer::new(1.0 / 3600.0, NonZeroU32::new(1).expect("non-zero"));
        let mut first = layer.layer(echo());
        let mut second = layer.layer(echo());
        first
            .ready()
            .await
            .expect("ready")
            .call(1)
            .await
            .expect("call");
        let blocked = tokio::time::timeout(Duration::from_millis(300), second.ready()).await;
        assert!(blocked.is_err(), "the second service got its own bucket");
    }

    #[tokio::test]
    async fn a_waiting_request_gets_through_when_its_token_comes() {
        // 50 a second, no burst: three requests take two waits of 20 ms.
        let layer = RateLimitLayer::new(50.0, NonZeroU32::MIN);
        let mut service = layer.layer(echo());
        let started = std::time::Instant::now();
        let three = async {
            for n in 0..3 {
                let answer = service.ready().await.expect("ready").call(n).await;
                assert_eq!(answer, Ok(n));
            }
        };
        tokio::time::timeout(Duration::from_secs(10), three)
            .await
            .expect("the requests waited for their tokens and got through");
        assert!(
            started.elapsed() >= Duration::from_millis(39),
            "three requests passed in {:?}, faster than the limit allows",
            started.elapsed()
        );
    }
}

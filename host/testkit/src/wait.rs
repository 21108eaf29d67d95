//! Waiting on a condition with a deadline: what the bed's servers and the tests poll through.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll `check` every `every` until it returns `Ok`, and return its value; past `within`, fail
/// with `what`, the last `Err` (the state seen) and `context()` (logs, say).
pub async fn poll_until<T, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    context: &dyn Fn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!(
                    "{what}: not reached in {within:?}; last: {last}\n{}",
                    context()
                )
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// [`poll_until`] every 50 ms, with no context.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_until(what, within, Duration::from_millis(50), &String::new, check).await
}

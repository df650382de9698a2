//! Polling for something expected to happen soon: a GPU's memory coming back, a stage's last
//! process going away.
//!
//! The first look is taken at once (the common case: it has already happened), later ones
//! after pauses that start at 1 ms and double up to a ceiling, so a quick outcome is seen
//! within a millisecond or two and a slow one costs few looks.

use std::time::{Duration, Instant};

/// The pauses between looks until a deadline: 1 ms, then doubling, never above the ceiling.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    ceiling: Duration,
    deadline: Instant,
}

impl Backoff {
    /// Pauses from 1 ms up to `ceiling`, for `limit` from now.
    pub fn new(limit: Duration, ceiling: Duration) -> Self {
        Backoff {
            next: Duration::from_millis(1).min(ceiling),
            ceiling,
            deadline: Instant::now() + limit,
        }
    }

    /// The pause to take before the next look, or `None` once the limit has passed (no more
    /// looks); each pause is twice the one before, up to the ceiling.
    pub fn pause(&mut self) -> Option<Duration> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let pause = self.next;
        self.next = (self.next * 2).min(self.ceiling);
        Some(pause)
    }
}

/// Calls `done` until it returns true (then true), or until `limit` has passed since the call
/// (then false). Sleeps on the async runtime between looks, pausing at most `ceiling`.
pub async fn poll(limit: Duration, ceiling: Duration, mut done: impl FnMut() -> bool) -> bool {
    let mut backoff = Backoff::new(limit, ceiling);
    while !done() {
        let Some(pause) = backoff.pause() else {
            return false;
        };
        tokio::time::sleep(pause).await;
    }
    true
}

/// [`poll`] for a caller outside the async runtime: the thread sleeps between looks.
pub fn poll_blocking(limit: Duration, ceiling: Duration, mut done: impl FnMut() -> bool) -> bool {
    let mut backoff = Backoff::new(limit, ceiling);
    while !done() {
        let Some(pause) = backoff.pause() else {
            return false;
        };
        std::thread::sleep(pause);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_ceiling() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_millis(5));
        let ms: Vec<u128> = (0..5).map(|_| b.pause().unwrap().as_millis()).collect();
        assert_eq!(ms, [1, 2, 4, 5, 5]);
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::from_millis(5)).pause(),
            None
        );
    }

    #[test]
    fn a_condition_already_true_is_seen_without_a_pause_and_a_false_one_times_out() {
        let start = Instant::now();
        assert!(poll_blocking(
            Duration::from_secs(5),
            Duration::from_millis(20),
            || true
        ));
        assert!(start.elapsed() < Duration::from_millis(50));
        let mut looks = 0;
        let start = Instant::now();
        assert!(!poll_blocking(
            Duration::from_millis(30),
            Duration::from_millis(10),
            || {
                looks += 1;
                false
            }
        ));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!((3..30).contains(&looks), "{looks} looks");
    }
}

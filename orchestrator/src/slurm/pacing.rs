//! Pacing of job-step launches: a run spread over an allocation ([`super::placement`]) starts
//! at most [`STEP_LAUNCHES_PER_S`] steps a second.
//!
//! Every `srun` is a request to `slurmctld` (a step to create, then its end to record), and
//! Slurm's high-throughput guidance is to keep the load a job puts on the controller low: a
//! sweep of thousands of instances over a large allocation must not start hundreds of steps
//! in the same instant when its first stages become ready, or when a node's worth of
//! instances ends together. The scheduler takes a token from a [`TokenBucket`] for every
//! fresh start and waits for the next token when there is none; the clock is an argument, so
//! the bucket and the scheduler are tested with made-up instants.

use std::time::{Duration, Instant};

/// At most this many job steps are launched a second by one run (after a first burst of as
/// many): a small figure next to a controller's capacity, and far more than a sweep of
/// instances that each run for seconds or longer needs.
pub const STEP_LAUNCHES_PER_S: u32 = 20;

/// A token bucket: `per_s` tokens a second, at most `burst` kept; one token a launch.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_s: f64,
    burst: f64,
    tokens: f64,
    at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens that refills at `per_s` a second (both at least 1).
    pub fn new(per_s: u32, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            per_s: f64::from(per_s.max(1)),
            burst,
            tokens: burst,
            at: None,
        }
    }

    /// The pacing of a run's step launches: [`STEP_LAUNCHES_PER_S`], a burst of as many.
    pub fn for_steps() -> TokenBucket {
        TokenBucket::new(STEP_LAUNCHES_PER_S, STEP_LAUNCHES_PER_S)
    }

    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let gained = now.saturating_duration_since(at).as_secs_f64() * self.per_s;
            self.tokens = (self.tokens + gained).min(self.burst);
        }
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
    }

    /// `None` when a launch may start at `now`, else when the next one may.
    pub fn next_at(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        (self.tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - self.tokens) / self.per_s))
    }

    /// Takes the token of a launch at `now` (the bucket may go below one token, never below
    /// zero by more than this launch).
    pub fn take(&mut self, now: Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        for _ in 0..3 {
            assert_eq!(b.next_at(t0), None);
            b.take(t0);
        }
        let next = b.next_at(t0).expect("the burst is spent");
        assert_eq!(next, t0 + Duration::from_millis(100));
        assert!(b.next_at(t0 + Duration::from_millis(99)).is_some());
        assert_eq!(b.next_at(t0 + Duration::from_millis(100)), None);
        b.take(t0 + Duration::from_millis(100));
        // A long pause refills no more than the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.next_at(later), None);
            b.take(later);
        }
        assert!(b.next_at(later).is_some());
    }
}

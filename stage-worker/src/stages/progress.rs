//! Time-based progress reporting that reads from the device only when it reports.

use std::time::{Duration, Instant};
use tch::Tensor;

/// Accumulates losses (on the device) and token counts between progress events.
pub struct ProgressClock {
    every: Duration,
    last: Instant,
    tokens: usize,
    steps: u64,
    loss_sum: Option<Tensor>,
}

/// What one progress event reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Mean loss of the steps since the last event.
    pub loss: f64,
    /// Tokens per second since the last event.
    pub tokens_per_s: f64,
}

impl ProgressClock {
    /// A clock that is due every `every_s` seconds, starting now.
    pub fn new(every_s: f64) -> Self {
        ProgressClock {
            every: Duration::from_secs_f64(every_s.max(0.0)),
            last: Instant::now(),
            tokens: 0,
            steps: 0,
            loss_sum: None,
        }
    }

    /// Records one step's loss (a device scalar; not read back) and token count.
    pub fn record(&mut self, loss: &Tensor, tokens: usize) {
        let loss = loss.detach();
        self.loss_sum = Some(match self.loss_sum.take() {
            Some(sum) => sum + loss,
            None => loss,
        });
        self.tokens += tokens;
        self.steps += 1;
    }

    /// Whether an event is due.
    pub fn due(&self) -> bool {
        self.steps > 0 && self.last.elapsed() >= self.every
    }

    /// Reads the interval's figures (waiting for the device) and starts a new interval.
    pub fn take(&mut self) -> Interval {
        let sum = self
            .loss_sum
            .take()
            .map(|s| s.double_value(&[]))
            .unwrap_or(f64::NAN);
        let loss = sum / self.steps.max(1) as f64;
        let now = Instant::now();
        let secs = now.duration_since(self.last).as_secs_f64();
        let tokens_per_s = if secs > 0.0 {
            self.tokens as f64 / secs
        } else {
            f64::NAN
        };
        self.last = now;
        self.tokens = 0;
        self.steps = 0;
        Interval { loss, tokens_per_s }
    }
}

//! Where each stage of a run stands, as the scheduler decides: a sweep holds one `StageState`
//! per instance for the whole run (100,000 of them in a large one), so it is two fields. What
//! each attempt left is the report's to keep, from the run's events
//! (`crate::report::stages`).

use protocol::report::CheckpointRecord;
use protocol::status::FailureClass;
use std::time::Instant;

/// Where a stage is in this run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    /// Not started (or waiting for its upstream stages or GPUs).
    Pending,
    /// Failed; retried at this instant.
    RetryAt(Instant),
    /// An attempt is running.
    Running,
    /// Done, outputs verified.
    Succeeded,
    /// Failed after its retries.
    Failed,
    /// Will not run: the class of the reason (`upstream_failed`, `interrupted`, `fail_fast`,
    /// `gpu_leaked`, as the report's `failure`) and the reason, for the user.
    Skipped(FailureClass, String),
    /// Stopped by a cancel.
    Cancelled,
}

/// A stage's state in this run.
pub(crate) struct StageState {
    /// Where it is.
    pub(crate) status: Status,
    /// Attempts so far (earlier runs' included).
    pub(crate) attempts: u32,
}

impl StageState {
    /// A stage that has not run in this run (after `attempts` earlier attempts).
    pub(crate) const fn pending(attempts: u32) -> StageState {
        StageState {
            status: Status::Pending,
            attempts,
        }
    }
}

impl crate::attempt::prepare::FinishedOutputs for crate::report::stages::StageRecords {
    fn outputs_of(&self, stage: usize) -> &[CheckpointRecord] {
        self.checkpoints(stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_state_stays_small() {
        // The per-stage budget of a 100,000-stage sweep (1 KiB in all) leaves this part little.
        assert!(std::mem::size_of::<StageState>() <= 48);
    }
}

//! The words of a run's outcome, as types: where a stage stands, how a run ended and why a
//! stage failed or did not run. Each serialises as the snake-case string the report, the
//! journal and the daemon's events have always carried (`"succeeded"`, `"cuda_oom"`, …), so
//! files written before these types existed read back unchanged.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A text that is none of a word type's values (`FromStr` of the types here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWord {
    /// The text.
    pub text: String,
    /// The type it was read as (`"StageStatus"`, …).
    pub kind: &'static str,
}

impl std::fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` is not a {}", self.text, self.kind)
    }
}

impl std::error::Error for UnknownWord {}

/// Defines a string-like enum: serde as snake case, `as_str`, `Display`, and `ALL`.
macro_rules! words {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The value as files and messages write it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<$name, UnknownWord> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownWord {
                        text: s.to_string(),
                        kind: stringify!($name),
                    })
            }
        }
    };
}

words! {
    /// Where a stage stands in a report or an event.
    StageStatus {
        /// Not started yet.
        Pending = "pending",
        /// An attempt is running.
        Running = "running",
        /// Finished, outputs verified.
        Succeeded = "succeeded",
        /// Failed after its retries.
        Failed = "failed",
        /// Did not run (see its [`FailureClass`]).
        Skipped = "skipped",
        /// Stopped by a cancel.
        Cancelled = "cancelled",
        /// Was running when its run stopped without a word (a killed orchestrator).
        Interrupted = "interrupted",
    }
}

words! {
    /// How a run ended (or that it has not).
    RunStatus {
        /// In a daemon's queue, not started yet (only in the daemon's list of runs).
        Queued = "queued",
        /// Still going.
        Running = "running",
        /// Every stage succeeded and every GPU check passed.
        Succeeded = "succeeded",
        /// Every stage succeeded, but a GPU check found leaked memory (`on_leak` other than
        /// `fail`): shown as "succeeded with leaked GPU memory", never as a success.
        SucceededLeaked = "succeeded_leaked",
        /// A stage failed or was skipped.
        Failed = "failed",
        /// Stopped by a signal or a cancel; `resume` continues it.
        Interrupted = "interrupted",
        /// A Slurm job that stopped and was requeued.
        Requeued = "requeued",
        /// A GPU leaked and `on_leak = "fail"`.
        Leaked = "leaked",
    }
}

impl RunStatus {
    /// The status as a person reads it: the wire word, except `succeeded_leaked`, which reads
    /// "succeeded with leaked GPU memory".
    pub fn label(self) -> &'static str {
        match self {
            RunStatus::SucceededLeaked => "succeeded with leaked GPU memory",
            other => other.as_str(),
        }
    }

    /// How the status should look: good only for a clean success; a warning for a success
    /// that leaked GPU memory or a stop; bad for a failure or a leak that failed the run.
    pub fn tone(self) -> Tone {
        match self {
            RunStatus::Succeeded => Tone::Good,
            RunStatus::Queued | RunStatus::Running => Tone::Neutral,
            RunStatus::SucceededLeaked | RunStatus::Interrupted | RunStatus::Requeued => Tone::Warn,
            RunStatus::Failed | RunStatus::Leaked => Tone::Bad,
        }
    }
}

/// How a status is shown: the colour a terminal or the web view gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Green: a clean success.
    Good,
    /// Amber: done, but not cleanly (leaked GPU memory, a stop).
    Warn,
    /// Red: failed.
    Bad,
    /// No colour: not finished.
    Neutral,
}

words! {
    /// Why a stage failed, or why it did not run.
    FailureClass {
        /// Its program could not be started.
        SpawnFailed = "spawn_failed",
        /// It exited with a non-zero code.
        ExitCode = "exit_code",
        /// A signal killed it.
        Signal = "signal",
        /// Something outside the orchestrator killed it (SIGKILL not sent by us).
        KilledExternally = "killed_externally",
        /// It ran past its timeout.
        Timeout = "timeout",
        /// It made no progress for its `stall_timeout` and was stopped.
        Hung = "hung",
        /// One of its ranks (a process of a multi-process stage) exited non-zero; the others
        /// were stopped after the stage's `rank_grace`.
        RankFailed = "rank_failed",
        /// CUDA ran out of memory.
        CudaOom = "cuda_oom",
        /// The kernel's OOM killer ended a process of its cgroup (host memory past `memory`).
        OomKilled = "oom_killed",
        /// It reported a failure itself.
        Reported = "reported",
        /// An input it needs is missing or changed.
        BadInput = "bad_input",
        /// It broke the event protocol.
        ProtocolViolation = "protocol_violation",
        /// A declared output is missing.
        MissingOutputs = "missing_outputs",
        /// An output does not match what the stage reported.
        CorruptOutput = "corrupt_output",
        /// It needs more GPUs than are usable.
        NoGpu = "no_gpu",
        /// Skipped: an upstream stage did not succeed.
        UpstreamFailed = "upstream_failed",
        /// Skipped: the run was interrupted first.
        Interrupted = "interrupted",
        /// Skipped: a stage failed and `fail_fast = true`.
        FailFast = "fail_fast",
        /// Skipped: a GPU leaked and `on_leak = "fail"`.
        GpuLeaked = "gpu_leaked",
    }
}

words! {
    /// One node's GPU check after a stage that ran through `srun`.
    NodeVerdict {
        /// Every GPU of the node back at its idle memory, none held.
        Clean = "clean",
        /// A GPU of the node still held or above its idle memory.
        NotClean = "not_clean",
        /// No NVML on the node: nothing could be checked.
        Unavailable = "unavailable",
        /// The check itself did not run or said nothing readable.
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_serialises_as_it_reads_and_round_trips() {
        for s in StageStatus::ALL {
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<StageStatus>(&json).unwrap(), *s);
            assert_eq!(s.as_str().parse::<StageStatus>().unwrap(), *s);
        }
        for s in RunStatus::ALL {
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        for s in NodeVerdict::ALL {
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        for s in FailureClass::ALL {
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        assert_eq!(FailureClass::CudaOom.as_str(), "cuda_oom");
        let err = "nonsense".parse::<RunStatus>().unwrap_err();
        assert_eq!(err.to_string(), "`nonsense` is not a RunStatus");
    }
}

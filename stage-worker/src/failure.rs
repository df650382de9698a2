//! Why a stage failed, and how that maps onto the `failed` event and the exit status.

use protocol::worker::{EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY};
use std::fmt;

/// The machine-readable class of a failure; fixes the event's `reason` and the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Unusable inputs or parameters: exit 65, reason `bad_input`.
    BadInput,
    /// The device ran out of memory: exit 66, reason `cuda_oom`.
    OutOfMemory,
    /// Stopped by SIGTERM/SIGINT after saving what it could: exit 75, reason `interrupted`.
    Interrupted,
    /// Anything else: exit 1, reason `error`.
    Other,
}

impl FailureKind {
    /// The `reason` string sent in the `failed` event.
    pub fn reason(self) -> &'static str {
        match self {
            FailureKind::BadInput => "bad_input",
            FailureKind::OutOfMemory => "cuda_oom",
            FailureKind::Interrupted => "interrupted",
            FailureKind::Other => "error",
        }
    }

    /// The process exit status for this class.
    pub fn exit_code(self) -> i32 {
        match self {
            FailureKind::BadInput => EXIT_BAD_INPUT,
            FailureKind::OutOfMemory => EXIT_OUT_OF_MEMORY,
            FailureKind::Interrupted => EXIT_INTERRUPTED,
            FailureKind::Other => 1,
        }
    }
}

/// A failure with a message meant for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The class of failure.
    pub kind: FailureKind,
    /// What went wrong, phrased for the user.
    pub message: String,
}

/// Result type of everything that can fail a stage.
pub type StageResult<T> = Result<T, Failure>;

impl Failure {
    /// A failure caused by unusable inputs or parameters.
    pub fn bad_input(message: impl Into<String>) -> Self {
        Failure {
            kind: FailureKind::BadInput,
            message: message.into(),
        }
    }

    /// A failure of no particular class.
    pub fn other(message: impl Into<String>) -> Self {
        Failure {
            kind: FailureKind::Other,
            message: message.into(),
        }
    }

    /// The stage was stopped by a signal.
    pub fn interrupted(message: impl Into<String>) -> Self {
        Failure {
            kind: FailureKind::Interrupted,
            message: message.into(),
        }
    }

    /// Classifies an error raised by libtorch: CUDA out-of-memory errors become
    /// [`FailureKind::OutOfMemory`], everything else [`FailureKind::Other`].
    pub fn from_torch(message: impl Into<String>) -> Self {
        let message = message.into();
        let kind = if is_cuda_oom(&message) {
            FailureKind::OutOfMemory
        } else {
            FailureKind::Other
        };
        Failure { kind, message }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tch::TchError> for Failure {
    fn from(err: tch::TchError) -> Self {
        Failure::from_torch(err.to_string())
    }
}

/// Whether a libtorch error message reports that CUDA ran out of memory
/// ("CUDA out of memory. Tried to allocate …" or "CUDA error: out of memory").
pub fn is_cuda_oom(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("cuda out of memory")
        || (lower.contains("cuda") && lower.contains("out of memory"))
}

/// A libtorch error as a user should read it: without tch's `unwrap` wrapper and quoting,
/// without the C++ stack trace, and at most 2000 bytes.
pub fn readable_message(message: &str) -> String {
    let mut text = message.trim();
    if let Some(rest) = text.strip_prefix("called `Result::unwrap()` on an `Err` value: ") {
        text = rest;
    }
    let mut owned = match text.strip_prefix("Torch(\"") {
        Some(inner) => inner
            .strip_suffix("\")")
            .unwrap_or(inner)
            .replace("\\n", "\n")
            .replace("\\\"", "\""),
        None => text.to_string(),
    };
    if let Some(cut) = owned.find("Exception raised from") {
        owned.truncate(cut);
    }
    let trimmed = owned.trim_end();
    const MAX: usize = 2_000;
    if trimmed.len() <= MAX {
        return trimmed.to_string();
    }
    let mut end = MAX;
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &trimmed[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_the_documented_codes() {
        assert_eq!(FailureKind::BadInput.exit_code(), 65);
        assert_eq!(FailureKind::OutOfMemory.exit_code(), 66);
        assert_eq!(FailureKind::Interrupted.exit_code(), 75);
        assert_eq!(FailureKind::Other.exit_code(), 1);
        assert_eq!(FailureKind::OutOfMemory.reason(), "cuda_oom");
    }

    #[test]
    fn torch_errors_are_classified() {
        let oom = Failure::from_torch(
            "Torch(\"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)\")",
        );
        assert_eq!(oom.kind, FailureKind::OutOfMemory);
        let oom2 = Failure::from_torch("CUDA error: out of memory");
        assert_eq!(oom2.kind, FailureKind::OutOfMemory);
        let other = Failure::from_torch("shape '[2, 3]' is invalid for input of size 5");
        assert_eq!(other.kind, FailureKind::Other);
    }

    #[test]
    fn torch_panics_read_cleanly() {
        let raw = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to allocate 2.00 GiB\\nException raised from malloc at alloc.cpp:1\\nframe #0: x\")";
        assert_eq!(
            readable_message(raw),
            "CUDA out of memory. Tried to allocate 2.00 GiB"
        );
        assert_eq!(readable_message("plain"), "plain");
        assert!(readable_message(&"x".repeat(5000)).ends_with('…'));
    }
}

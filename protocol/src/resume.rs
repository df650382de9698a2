//! What `orchestrate status DIR` and a resumed run decide for each stage of an interrupted run
//! (in `status --json`, under `resume`).

use crate::report::CheckpointRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a resumed run does with one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Finished earlier and still valid: not run again.
    Keep {
        /// Attempts made so far.
        attempts: u32,
        /// Its verified outputs.
        checkpoints: Vec<CheckpointRecord>,
        /// Its last metrics.
        metrics: BTreeMap<String, f64>,
        /// Wall time of its successful attempt.
        wall_s: Option<f64>,
    },
    /// Runs (again).
    Run {
        /// Why, for the user.
        reason: String,
        /// Attempts made so far.
        attempts: u32,
        /// Whether its old outputs must be cleared first (they belong to another definition
        /// or are corrupt); an interrupted stage keeps them for in-stage resume.
        clear_output: bool,
    },
}

impl Decision {
    /// Whether the stage is kept.
    pub fn kept(&self) -> bool {
        matches!(self, Decision::Keep { .. })
    }
}

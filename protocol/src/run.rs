//! `run.json`: what a run directory records about the run itself, so that `resume`, `status`
//! and `report` work from the directory alone, wherever it has been moved.

use serde::{Deserialize, Serialize};

/// The plan's own format: a run keeps the plan exactly as it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanFormat {
    /// TOML (`plan.toml`).
    Toml,
    /// JSON (`plan.json`).
    Json,
}

impl PlanFormat {
    /// The file name the run directory keeps the plan under.
    pub fn file_name(self) -> &'static str {
        match self {
            PlanFormat::Toml => "plan.toml",
            PlanFormat::Json => "plan.json",
        }
    }
}

/// The contents of `<run>/run.json`, rewritten at every (re)start of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// Format of the plan copy in the run directory.
    pub plan_format: PlanFormat,
    /// The plan as the user named it when the run (or its last resume) started.
    pub plan_source: String,
    /// The absolute directory relative paths of the plan are resolved against (the plan
    /// file's directory): stages' working directory, `./script.sh`, matrix globs, data files.
    pub base_dir: String,
    /// Version of `orchestrate` that wrote this.
    pub orchestrate_version: String,
}

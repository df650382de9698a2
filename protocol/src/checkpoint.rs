//! The manifest that makes a stage's output directory verifiable.
//!
//! A writer puts its files in place first (temp file, fsync, rename), then writes
//! `manifest.json` the same way; a reader that finds the manifest may trust that every file it
//! lists was complete when listed, and checks sizes and SHA-256 before use.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// File name of the manifest inside an output directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// What a checkpoint directory holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointManifest {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// The files, relative to the directory, with sizes and checksums.
    pub files: Vec<ManifestFile>,
    /// Training step the weights are from.
    #[serde(default)]
    pub step: Option<u64>,
    /// Model shape and anything else a loader needs (free-form JSON).
    #[serde(default)]
    pub model: serde_json::Value,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ManifestFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256, lower-case hex.
    pub sha256: String,
}

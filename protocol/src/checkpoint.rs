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
    /// SHA-256, lower-case hex (see [`hex`]).
    pub sha256: String,
}

/// `bytes` as lower-case hex, two digits a byte: how every SHA-256 in a manifest, a worker's
/// events, the journal and the report is written, so checksums from any writer compare equal
/// as strings.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// Which file on disk a writer produced: enough to tell, without reading it, that a file is
/// still the very one whose checksum the writer computed while writing it.
///
/// A reader that finds a file with the same device, inode, size and modification time as a
/// writer reported may take the writer's checksum for it; anything else (a rewrite, a copy, a
/// truncation) changes at least one of them. Corruption that keeps all four (a bit flipped on
/// disk, an edit that restores the time) is caught by a full re-hash, which resume and every
/// built-in stage that reads the checkpoint still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileIdentity {
    /// `st_dev` of the file system holding it.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

impl FileIdentity {
    /// The identity of the file `meta` describes; writer and reader call this same function,
    /// so the two agree field for field.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(hex(&[]), "");
    }
}

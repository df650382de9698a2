//! SHA-256 of files and the verification of checkpoint manifests.

use protocol::checkpoint::{CheckpointManifest, FileIdentity, MANIFEST_FILE};
use protocol::report::CheckpointRecord;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// SHA-256 (lower-case hex) and size of a file, read once.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((protocol::checkpoint::hex(&hasher.finalize()), total))
}

/// A file a stage reported writing (a `checkpoint` event): its checksum, computed by the
/// writer while writing, and its identity once it was in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedFile {
    /// SHA-256, lower-case hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Device, inode and modification time.
    pub identity: FileIdentity,
}

/// How closely [`check_file`] looks at a file.
#[derive(Debug, Clone, Copy)]
pub enum Depth<'a> {
    /// Its size only: a cheap look, for a file whose contents were verified moments ago.
    Size,
    /// Its size, then its SHA-256; a file that is, by its identity and size, one the stage
    /// reported writing with the recorded checksum is taken on the writer's word (it hashed
    /// those bytes as it wrote them). Pass no reported files to hash every file.
    Content {
        /// Files a stage reported writing.
        reported: &'a [ReportedFile],
    },
}

/// Why a file is not the one recorded (its size and SHA-256).
#[derive(Debug)]
pub enum FileMismatch {
    /// It cannot be found (or its metadata read).
    Missing(std::io::Error),
    /// It has another size.
    Size {
        /// Its size now, in bytes.
        actual: u64,
    },
    /// It could not be read to hash it.
    Unreadable(std::io::Error),
    /// Its bytes hash to another SHA-256.
    Checksum {
        /// Its SHA-256 now, lower-case hex.
        actual: String,
    },
}

/// Checks the file at `path` against the size and SHA-256 recorded for it, as closely as
/// `depth` says: the one check behind manifests, resume and a stage's inputs.
pub fn check_file(
    path: &Path,
    bytes: u64,
    sha256: &str,
    depth: Depth<'_>,
) -> Result<(), FileMismatch> {
    let meta = std::fs::metadata(path).map_err(FileMismatch::Missing)?;
    if meta.len() != bytes {
        return Err(FileMismatch::Size { actual: meta.len() });
    }
    let Depth::Content { reported } = depth else {
        return Ok(());
    };
    let identity = FileIdentity::of(&meta);
    if reported
        .iter()
        .any(|r| r.identity == identity && r.bytes == bytes && r.sha256 == sha256)
    {
        return Ok(());
    }
    let (actual, _) = sha256_file(path).map_err(FileMismatch::Unreadable)?;
    if actual != sha256 {
        return Err(FileMismatch::Checksum { actual });
    }
    Ok(())
}

/// Why a checkpoint directory's manifest does not vouch for its files.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The manifest exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    ReadManifest {
        /// The manifest.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not a manifest (not JSON, or not its shape).
    #[error("{path} is not a valid manifest: {source}")]
    InvalidManifest {
        /// The manifest.
        path: PathBuf,
        /// What the decoder said.
        #[source]
        source: serde_json::Error,
    },
    /// A listed file cannot be found (or its metadata read).
    #[error("checkpoint file {path} is missing: {source}")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A listed file has another size than the manifest says.
    #[error(
        "checkpoint file {path} is {actual} bytes, the manifest says {expected}: it is truncated or was overwritten"
    )]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size now, in bytes.
        actual: u64,
        /// Its size in the manifest, in bytes.
        expected: u64,
    },
    /// A listed file could not be read to hash it.
    #[error("cannot read checkpoint file {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A listed file's bytes hash to another SHA-256 than the manifest's.
    #[error(
        "checkpoint file {path} does not match its manifest checksum (sha256 {actual}, expected {expected}): it is corrupted"
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Its SHA-256 now, lower-case hex.
        actual: String,
        /// Its SHA-256 in the manifest, lower-case hex.
        expected: String,
    },
}

/// Reads `dir/manifest.json` and checks every file it lists (size, then SHA-256).
///
/// Returns `Ok(None)` when the directory has no manifest; `Err` says, for the user, why the
/// manifest is unreadable or which file is missing, truncated or altered.
pub fn verify_manifest_dir(dir: &Path) -> Result<Option<Vec<CheckpointRecord>>, VerifyError> {
    verify_manifest_dir_reported(dir, &[])
}

/// Like [`verify_manifest_dir`], but a listed file that is, by its identity (device, inode,
/// modification time) and size, the very file a stage reported in `reported` with the
/// manifest's checksum, is accepted without being read: its writer hashed those bytes as it
/// wrote them. Every other file is read and hashed. This keeps a whole re-read of a large
/// checkpoint off the path between two stages; resume still re-hashes everything.
pub fn verify_manifest_dir_reported(
    dir: &Path,
    reported: &[ReportedFile],
) -> Result<Option<Vec<CheckpointRecord>>, VerifyError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(VerifyError::ReadManifest {
                path: manifest_path,
                source,
            })
        }
    };
    let manifest: CheckpointManifest =
        serde_json::from_str(&text).map_err(|source| VerifyError::InvalidManifest {
            path: manifest_path.clone(),
            source,
        })?;
    let mut records = Vec::with_capacity(manifest.files.len() + 1);
    for entry in &manifest.files {
        let path = dir.join(&entry.path);
        let depth = Depth::Content { reported };
        if let Err(mismatch) = check_file(&path, entry.bytes, &entry.sha256, depth) {
            return Err(match mismatch {
                FileMismatch::Missing(source) => VerifyError::Missing { path, source },
                FileMismatch::Size { actual } => VerifyError::Size {
                    path,
                    actual,
                    expected: entry.bytes,
                },
                FileMismatch::Unreadable(source) => VerifyError::Unreadable { path, source },
                FileMismatch::Checksum { actual } => VerifyError::Checksum {
                    path,
                    actual,
                    expected: entry.sha256.clone(),
                },
            });
        }
        records.push(CheckpointRecord {
            path: path.display().to_string(),
            bytes: entry.bytes,
            sha256: entry.sha256.clone(),
        });
    }
    Ok(Some(records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_checkpoint(dir: &Path, content: &[u8]) -> CheckpointManifest {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("w.bin"), content).unwrap();
        let (sha256, bytes) = sha256_file(&dir.join("w.bin")).unwrap();
        let manifest = CheckpointManifest {
            v: protocol::PROTOCOL_VERSION,
            files: vec![protocol::checkpoint::ManifestFile {
                path: "w.bin".into(),
                bytes,
                sha256,
            }],
            step: None,
            model: serde_json::Value::Null,
        };
        std::fs::write(
            dir.join(MANIFEST_FILE),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        manifest
    }

    #[test]
    fn a_reported_file_is_taken_on_its_identity_and_anything_else_is_hashed() {
        let dir = crate::testutil::scratch("checksum-reported");
        let manifest = write_checkpoint(&dir, b"weights!");
        let path = dir.join("w.bin");
        let entry = &manifest.files[0];
        let reported = ReportedFile {
            sha256: entry.sha256.clone(),
            bytes: entry.bytes,
            identity: FileIdentity::of(&std::fs::metadata(&path).unwrap()),
        };
        // Same size, same inode, same modification time, other bytes: the writer's word is
        // taken (no read), while a full verification sees the corruption.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, b"weights?").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let records = verify_manifest_dir_reported(&dir, std::slice::from_ref(&reported))
            .unwrap()
            .unwrap();
        assert_eq!(records[0].sha256, entry.sha256);
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
        assert!(err.to_string().ends_with(": it is corrupted"), "{err}");
        // A file that is not the reported one (here: a new modification time) is hashed.
        std::fs::write(&path, b"weights?").unwrap();
        let err = verify_manifest_dir_reported(&dir, &[reported]).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! Checksums of files and the verification of checkpoint manifests.

use protocol::checkpoint::{
    Algorithm, CheckpointManifest, Checksum, FileIdentity, Hasher, MANIFEST_FILE,
    MANIFEST_VERSIONS_READ,
};
use protocol::report::CheckpointRecord;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Checksum under `algorithm` and size of a file, read once.
pub fn checksum_file(path: &Path, algorithm: Algorithm) -> std::io::Result<(Checksum, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Hasher::new(algorithm);
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
    Ok((hasher.finalize(), total))
}

/// The checksum and size to record for a declared output file with no manifest: the writer's
/// own checksum when the file is, by its identity and size, one the stage reported writing;
/// else the file is read and hashed with [`Algorithm::PREFERRED`].
pub fn record_file(path: &Path, reported: &[ReportedFile]) -> std::io::Result<(Checksum, u64)> {
    let meta = std::fs::metadata(path)?;
    let identity = FileIdentity::of(&meta);
    if let Some(r) = reported
        .iter()
        .find(|r| r.identity == identity && r.bytes == meta.len())
    {
        return Ok((r.checksum.clone(), r.bytes));
    }
    checksum_file(path, Algorithm::PREFERRED)
}

/// A file a stage reported writing (a `checkpoint` event): its checksum, computed by the
/// writer while writing, and its identity once it was in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedFile {
    /// Its checksum, as the writer computed it.
    pub checksum: Checksum,
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
    /// Its size, then its checksum; a file that is, by its identity and size, one the stage
    /// reported writing with the recorded checksum is taken on the writer's word (it hashed
    /// those bytes as it wrote them). Pass no reported files to hash every file.
    Content {
        /// Files a stage reported writing.
        reported: &'a [ReportedFile],
    },
}

/// Why a file is not the one recorded (its size and checksum).
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
    /// Its bytes hash to another checksum (under the recorded one's algorithm).
    Checksum {
        /// Its checksum now.
        actual: Checksum,
    },
}

/// Checks the file at `path` against the size and checksum recorded for it (hashing it with the
/// recorded checksum's algorithm), as closely as `depth` says: the one check behind manifests,
/// resume and a stage's inputs.
pub fn check_file(
    path: &Path,
    bytes: u64,
    checksum: &Checksum,
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
        .any(|r| r.identity == identity && r.bytes == bytes && r.checksum.matches(checksum))
    {
        return Ok(());
    }
    let (actual, _) =
        checksum_file(path, checksum.algorithm()).map_err(FileMismatch::Unreadable)?;
    if !actual.matches(checksum) {
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
    /// A listed file's bytes hash to another checksum than the manifest's.
    #[error(
        "checkpoint file {path} does not match its manifest checksum ({actual}, expected {}): it is corrupted",
        expected.hex()
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Its checksum now.
        actual: Checksum,
        /// Its checksum in the manifest.
        expected: Checksum,
    },
    /// The manifest is of a version this orchestrator does not read.
    #[error(
        "{path} has format version {v}; this orchestrate reads versions {}–{}: upgrade orchestrate",
        MANIFEST_VERSIONS_READ.start(),
        MANIFEST_VERSIONS_READ.end()
    )]
    Version {
        /// The manifest.
        path: PathBuf,
        /// Its version.
        v: u32,
    },
}

/// Reads `dir/manifest.json` and checks every file it lists (size, then checksum).
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
    if !MANIFEST_VERSIONS_READ.contains(&manifest.v) {
        return Err(VerifyError::Version {
            path: manifest_path,
            v: manifest.v,
        });
    }
    let mut records = Vec::with_capacity(manifest.files.len() + 1);
    for entry in &manifest.files {
        let path = dir.join(&entry.path);
        let depth = Depth::Content { reported };
        if let Err(mismatch) = check_file(&path, entry.bytes, &entry.checksum, depth) {
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
                    expected: entry.checksum.clone(),
                },
            });
        }
        records.push(CheckpointRecord {
            path: path.display().to_string(),
            bytes: entry.bytes,
            checksum: entry.checksum.clone(),
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
        let (checksum, bytes) = checksum_file(&dir.join("w.bin"), Algorithm::PREFERRED).unwrap();
        let manifest = CheckpointManifest {
            v: protocol::checkpoint::MANIFEST_VERSION,
            files: vec![protocol::checkpoint::ManifestFile {
                path: "w.bin".into(),
                bytes,
                checksum,
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
            checksum: entry.checksum.clone(),
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
        assert_eq!(records[0].checksum, entry.checksum);
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
        assert!(err.to_string().ends_with(": it is corrupted"), "{err}");
        // A file that is not the reported one (here: a new modification time) is hashed.
        std::fs::write(&path, b"weights?").unwrap();
        let err = verify_manifest_dir_reported(&dir, &[reported]).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_version_1_manifest_is_verified_with_sha256_and_an_unknown_version_is_refused() {
        let dir = crate::testutil::scratch("checksum-v1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.bin"), b"weights!").unwrap();
        let sha = Checksum::of(Algorithm::Sha256, b"weights!");
        let write = |v: u32, sha: &str| {
            let text =
                format!(r#"{{"v":{v},"files":[{{"path":"w.bin","bytes":8,"sha256":"{sha}"}}]}}"#);
            std::fs::write(dir.join(MANIFEST_FILE), text).unwrap();
        };
        write(1, sha.hex());
        let records = verify_manifest_dir(&dir).unwrap().unwrap();
        assert_eq!(records[0].checksum, sha);
        write(1, &"0".repeat(64));
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("(sha256 {}, expected 000", sha.hex())),
            "{err}"
        );
        write(3, sha.hex());
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(matches!(err, VerifyError::Version { v: 3, .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! Checksums of files and the verification of checkpoint manifests.

use protocol::checkpoint::{
    Algorithm, CheckpointManifest, Checksum, FileIdentity, Hasher, MANIFEST_FILE,
    MANIFEST_VERSIONS_READ,
};
use protocol::report::CheckpointRecord;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The most a manifest may hold, in bytes (one of a million files is about 150 MB; one of
/// ours, a few hundred bytes a file).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// An abort flag that is never raised, for reads that need not be interruptible.
static NEVER: AtomicBool = AtomicBool::new(false);

/// Checksum under `algorithm` and size of a regular file, read once. Anything else (a FIFO, a
/// device, a directory) is refused without blocking: see [`crate::store::user_file::open_regular`].
#[cfg(test)]
pub fn checksum_file(path: &Path, algorithm: Algorithm) -> std::io::Result<(Checksum, u64)> {
    checksum_file_until(path, algorithm, &NEVER)
}

/// [`checksum_file`], given up (with [`std::io::ErrorKind::Interrupted`]) within one read of
/// a mebibyte once `abort` is raised: a shutdown never waits for a large file to be hashed.
pub fn checksum_file_until(
    path: &Path,
    algorithm: Algorithm,
    abort: &AtomicBool,
) -> std::io::Result<(Checksum, u64)> {
    let (mut file, _) = crate::store::user_file::open_regular(path).map_err(into_io)?;
    let mut hasher = Hasher::new(algorithm);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        if abort.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hasher.finalize(), total))
}

/// The error of a verification given up because the run is stopping.
pub fn interrupted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Interrupted,
        "verification interrupted: the run is stopping",
    )
}

fn into_io(e: crate::store::user_file::UserFileError) -> std::io::Error {
    match e {
        crate::store::user_file::UserFileError::Io(e) => e,
        other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
    }
}

/// The checksum and size to record for a declared output file with no manifest, read and
/// hashed (interruptibly, see [`checksum_file_until`]). When the stage reported writing this
/// very file (same identity and size), it is hashed with the writer's algorithm and must match
/// what the writer reported: a reported checksum is verified, never taken on trust.
pub fn record_file(
    path: &Path,
    reported: &[ReportedFile],
    abort: &AtomicBool,
) -> std::io::Result<(Checksum, u64)> {
    let meta = std::fs::metadata(path)?;
    let identity = FileIdentity::of(&meta);
    let claimed = reported
        .iter()
        .find(|r| r.identity == identity && r.bytes == meta.len());
    let algorithm = claimed.map_or(Algorithm::PREFERRED, |r| r.checksum.algorithm());
    let (actual, bytes) = checksum_file_until(path, algorithm, abort)?;
    if let Some(claimed) = claimed.filter(|c| !c.checksum.matches(&actual)) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the stage reported {} for it, but its bytes hash to {actual}: it changed after it was reported, or the report is wrong",
                claimed.checksum
            ),
        ));
    }
    Ok((actual, bytes))
}

/// A file a stage reported writing (a `checkpoint` event): its checksum, computed by the
/// writer while writing, and its identity once it was in place. Only ever checked against
/// the file's bytes, never a substitute for reading them.
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
pub enum Depth {
    /// Its size only: a cheap look, for a file whose contents were verified moments ago.
    Size,
    /// Its size, then its checksum: every byte is read.
    Content,
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
    /// It could not be read to hash it (or is not a regular file).
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
    depth: Depth,
) -> Result<(), FileMismatch> {
    check_file_until(path, bytes, checksum, depth, &NEVER)
}

/// [`check_file`], given up (as [`FileMismatch::Unreadable`] of kind
/// [`std::io::ErrorKind::Interrupted`]) once `abort` is raised.
pub fn check_file_until(
    path: &Path,
    bytes: u64,
    checksum: &Checksum,
    depth: Depth,
    abort: &AtomicBool,
) -> Result<(), FileMismatch> {
    let meta = std::fs::metadata(path).map_err(FileMismatch::Missing)?;
    if let Some(kind) = crate::store::user_file::non_regular_kind(&meta) {
        return Err(FileMismatch::Unreadable(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {kind}, not a regular file"),
        )));
    }
    if meta.len() != bytes {
        return Err(FileMismatch::Size { actual: meta.len() });
    }
    if let Depth::Size = depth {
        return Ok(());
    }
    let (actual, _) =
        checksum_file_until(path, checksum.algorithm(), abort).map_err(FileMismatch::Unreadable)?;
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
    /// The manifest lists a file that is not its directory's own (an absolute path, a `..`, a
    /// symbolic link out of the directory).
    #[error(
        "{manifest} lists `{path}`, which is not inside its directory: a manifest lists the checkpoint's own files, by paths relative to it"
    )]
    Outside {
        /// The entry, as the manifest writes it.
        path: String,
        /// The manifest.
        manifest: PathBuf,
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
/// manifest is unreadable or which file is missing, truncated, altered or not the directory's
/// own (see [`verify_manifest_dir_until`]).
#[cfg(test)]
pub fn verify_manifest_dir(dir: &Path) -> Result<Option<Vec<CheckpointRecord>>, VerifyError> {
    verify_manifest_dir_until(dir, &[], &NEVER)
}

/// Like [`verify_manifest_dir`], given up with [`VerifyError::Unreadable`] of kind
/// [`std::io::ErrorKind::Interrupted`] once `abort` is raised.
///
/// Every listed file is read and hashed, except one that is, by its identity (device, inode,
/// modification time) and size, a file in `written_by_us` with the manifest's checksum: pass
/// there only what the built-in worker (this project's own binary, which hashed those bytes as
/// it wrote them) reported, never what an arbitrary program said. A manifest is read only if it
/// is a regular file of at most [`MAX_MANIFEST_BYTES`], and lists only regular files inside
/// `dir` (a relative path without `..`, that does not lead out of `dir` through a symbolic
/// link): a manifest cannot vouch for `/etc/hostname`.
pub fn verify_manifest_dir_until(
    dir: &Path,
    written_by_us: &[ReportedFile],
    abort: &AtomicBool,
) -> Result<Option<Vec<CheckpointRecord>>, VerifyError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match crate::store::user_file::read_regular(&manifest_path, MAX_MANIFEST_BYTES) {
        Ok(bytes) => bytes,
        Err(crate::store::user_file::UserFileError::Io(e))
            if e.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(VerifyError::ReadManifest {
                path: manifest_path,
                source: into_io(e),
            })
        }
    };
    let manifest: CheckpointManifest =
        serde_json::from_slice(&text).map_err(|source| VerifyError::InvalidManifest {
            path: manifest_path.clone(),
            source,
        })?;
    if !MANIFEST_VERSIONS_READ.contains(&manifest.v) {
        return Err(VerifyError::Version {
            path: manifest_path,
            v: manifest.v,
        });
    }
    let root = std::fs::canonicalize(dir).map_err(|source| VerifyError::ReadManifest {
        path: manifest_path.clone(),
        source,
    })?;
    let mut records = Vec::with_capacity(manifest.files.len() + 1);
    for entry in &manifest.files {
        let path = dir.join(&entry.path);
        let own = Path::new(&entry.path)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && !entry.path.is_empty();
        if !own {
            return Err(VerifyError::Outside {
                path: entry.path.clone(),
                manifest: manifest_path,
            });
        }
        match std::fs::canonicalize(&path) {
            Ok(real) if !real.starts_with(&root) => {
                return Err(VerifyError::Outside {
                    path: format!("{} (a link to {})", entry.path, real.display()),
                    manifest: manifest_path,
                })
            }
            _ => {}
        }
        let depth = if written(&path, entry, written_by_us) {
            Depth::Size
        } else {
            Depth::Content
        };
        if let Err(mismatch) = check_file_until(&path, entry.bytes, &entry.checksum, depth, abort) {
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

/// Whether the file at `path` is, by its identity and size, one in `reported` with the
/// manifest entry's checksum.
fn written(
    path: &Path,
    entry: &protocol::checkpoint::ManifestFile,
    reported: &[ReportedFile],
) -> bool {
    if reported.is_empty() {
        return false;
    }
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let identity = FileIdentity::of(&meta);
    reported.iter().any(|r| {
        r.identity == identity && r.bytes == entry.bytes && r.checksum.matches(&entry.checksum)
    })
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
    fn a_reported_checksum_is_verified_not_trusted() {
        let dir = crate::testutil::scratch("checksum-reported");
        let manifest = write_checkpoint(&dir, b"weights!");
        let path = dir.join("w.bin");
        let identity = FileIdentity::of(&std::fs::metadata(&path).unwrap());
        let honest = ReportedFile {
            checksum: Checksum::of(Algorithm::Sha256, b"weights!"),
            bytes: 8,
            identity,
        };
        // The writer's algorithm is used, and its checksum matches the bytes.
        let (checksum, bytes) = record_file(&path, std::slice::from_ref(&honest), &NEVER).unwrap();
        assert_eq!((checksum, bytes), (honest.checksum.clone(), 8));
        // A made-up checksum with the file's very identity is caught.
        let liar = ReportedFile {
            checksum: Checksum::of(Algorithm::Sha256, b"other!!!"),
            ..honest
        };
        let err = record_file(&path, &[liar], &NEVER).unwrap_err();
        assert!(
            err.to_string().contains("the stage reported sha256"),
            "{err}"
        );
        // Same size, same inode, same modification time, other bytes: the manifest check
        // reads the file and sees it.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, b"weights?").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert_eq!(
            FileIdentity::of(&std::fs::metadata(&path).unwrap()),
            identity
        );
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
        assert!(err.to_string().ends_with(": it is corrupted"), "{err}");
        assert_eq!(manifest.files.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_files_the_built_in_worker_reported_are_taken_on_its_word() {
        let dir = crate::testutil::scratch("checksum-builtin");
        let manifest = write_checkpoint(&dir, b"weights!");
        let path = dir.join("w.bin");
        let ours = ReportedFile {
            checksum: manifest.files[0].checksum.clone(),
            bytes: 8,
            identity: FileIdentity::of(&std::fs::metadata(&path).unwrap()),
        };
        // Other bytes, same size, inode and modification time: taken on the worker's word
        // when it is ours, read (and refused) otherwise.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, b"weights?").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let records = verify_manifest_dir_until(&dir, std::slice::from_ref(&ours), &NEVER)
            .unwrap()
            .unwrap();
        assert_eq!(records[0].checksum, ours.checksum);
        let err = verify_manifest_dir_until(&dir, &[], &NEVER).unwrap_err();
        assert!(matches!(err, VerifyError::Checksum { .. }), "{err}");
    }

    #[test]
    fn a_manifest_vouches_only_for_regular_files_of_its_own_directory() {
        let root = crate::testutil::scratch("checksum-outside");
        let dir = root.join("ckpt");
        std::fs::create_dir_all(&dir).unwrap();
        let host = b"host name\n".to_vec();
        std::fs::write(root.join("secret"), &host).unwrap();
        let sum = Checksum::of(Algorithm::Blake3, &host);
        let write = |path: &str| {
            let text = format!(
                r#"{{"v":2,"files":[{{"path":"{path}","bytes":{},"blake3":"{}"}}]}}"#,
                host.len(),
                sum.hex()
            );
            std::fs::write(dir.join(MANIFEST_FILE), text).unwrap();
        };
        for path in ["/etc/hostname", "../../../../../../../../etc/hostname"] {
            write(path);
            let err = verify_manifest_dir(&dir).unwrap_err();
            assert!(matches!(err, VerifyError::Outside { .. }), "{path}: {err}");
            assert!(
                err.to_string().contains("not inside its directory"),
                "{err}"
            );
        }
        std::os::unix::fs::symlink(root.join("secret"), dir.join("host")).unwrap();
        write("host");
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(err.to_string().contains("secret)"), "{err}");
        // A FIFO listed in a manifest is refused at once, not opened.
        let c = std::ffi::CString::new(dir.join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        write("pipe");
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        // A manifest that is itself a FIFO is refused too.
        std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        std::fs::rename(dir.join("pipe"), dir.join(MANIFEST_FILE)).unwrap();
        let err = verify_manifest_dir(&dir).unwrap_err();
        assert!(matches!(err, VerifyError::ReadManifest { .. }), "{err}");
    }

    #[test]
    fn hashing_stops_once_aborted() {
        let abort = AtomicBool::new(true);
        let err =
            checksum_file_until(Path::new("/etc/hostname"), Algorithm::Blake3, &abort).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted);
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

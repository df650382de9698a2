//! A finished attempt's outputs, checked and recorded: its manifest (if it wrote one) and every
//! file it declared, each with its size and checksum, so that resume and `status` can tell
//! later whether any of them changed.
//!
//! Promises:
//! - a declared output that is a directory (or `"."`, the whole output directory) is recorded
//!   file by file: every regular file under it;
//! - only regular files are recorded, and only files inside the stage's output directory: a
//!   FIFO, a device or a socket is refused without being opened, and so is a symbolic link that
//!   leads out of the output directory (or to a directory, inside a declared directory);
//! - every file is read and hashed (a checksum a stage's program reported is checked against
//!   the bytes, never taken instead of them), except the files of a built-in stage's manifest
//!   that its worker, this project's own `stage-worker`, reported with the manifest's checksum
//!   and whose identity (device, inode, modification time) and size are unchanged;
//! - the hashing gives up within a mebibyte once the caller raises its abort flag.

use crate::checksum::ReportedFile;
use protocol::report::CheckpointRecord;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The most files one attempt's outputs may hold.
pub const MAX_OUTPUT_FILES: usize = 100_000;

/// How deep a declared directory is walked.
const MAX_DEPTH: usize = 64;

/// Why an attempt's outputs were not recorded.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Declared outputs that are not there (paths, for the user).
    #[error("declared outputs are missing: {}", .0.join(", "))]
    Missing(Vec<String>),
    /// An output is there but is not one that can be recorded, or does not verify.
    #[error("{0}")]
    Refused(String),
    /// The abort flag was raised: the run is stopping.
    #[error("verification interrupted: the run is stopping")]
    Interrupted,
}

/// Checks and records the outputs of an attempt whose output directory is `dir`: the files its
/// manifest lists (required when `builtin`), then every declared output (`declared`, relative
/// to `dir`) not already recorded. `reported` are the files the stage said it wrote; see the
/// module's promises.
pub fn record(
    dir: &Path,
    declared: &[String],
    builtin: bool,
    reported: &[ReportedFile],
    abort: &AtomicBool,
) -> Result<Vec<CheckpointRecord>, OutputError> {
    let missing: Vec<String> = declared
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| std::fs::metadata(p).is_err() && std::fs::symlink_metadata(p).is_err())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(OutputError::Missing(missing));
    }
    // The built-in worker is this project's own binary, which hashed its checkpoint as it
    // wrote it: its manifest's files are taken by identity. Anything else is read.
    let written_by_us = if builtin { reported } else { &[] };
    let mut records = match crate::checksum::verify_manifest_dir_until(dir, written_by_us, abort) {
        Ok(Some(records)) => records,
        Ok(None) if builtin => {
            return Err(OutputError::Missing(vec![dir
                .join(protocol::checkpoint::MANIFEST_FILE)
                .display()
                .to_string()]))
        }
        Ok(None) => Vec::new(),
        Err(crate::checksum::VerifyError::Unreadable { source, .. })
            if source.kind() == std::io::ErrorKind::Interrupted =>
        {
            return Err(OutputError::Interrupted)
        }
        Err(why) => return Err(OutputError::Refused(why.to_string())),
    };
    let root = std::fs::canonicalize(dir).map_err(|e| {
        OutputError::Refused(format!(
            "cannot open the output directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut walk = Walk {
        root: &root,
        files: Vec::new(),
    };
    for name in declared {
        // Collected components drop a `.` inside the path: `output/./a` is `output/a`.
        let path: PathBuf = dir.join(name).components().collect();
        walk.declared(&path, 0)?;
    }
    for path in walk.files {
        if records.iter().any(|r| Path::new(&r.path) == path) {
            continue;
        }
        if records.len() >= MAX_OUTPUT_FILES {
            return Err(too_many(dir));
        }
        let (checksum, bytes) =
            crate::checksum::record_file(&path, reported, abort).map_err(|e| {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    OutputError::Interrupted
                } else {
                    OutputError::Refused(format!("cannot record {}: {e}", path.display()))
                }
            })?;
        records.push(CheckpointRecord {
            path: path.display().to_string(),
            bytes,
            checksum,
        });
    }
    Ok(records)
}

fn too_many(dir: &Path) -> OutputError {
    OutputError::Refused(format!(
        "the outputs under {} hold more than {MAX_OUTPUT_FILES} files: declare fewer (or pack them into an archive)",
        dir.display()
    ))
}

/// The regular files the declared outputs name, in a stable order (declared order, then
/// sorted by name within a directory), each once.
struct Walk<'a> {
    /// The output directory, canonical.
    root: &'a Path,
    files: Vec<PathBuf>,
}

impl Walk<'_> {
    /// Adds the declared output `path`: a regular file, or every regular file under a
    /// directory.
    fn declared(&mut self, path: &Path, depth: usize) -> Result<(), OutputError> {
        let link = std::fs::symlink_metadata(path)
            .map_err(|e| OutputError::Refused(format!("cannot read {}: {e}", path.display())))?;
        if link.file_type().is_symlink() {
            let real = std::fs::canonicalize(path).map_err(|e| {
                OutputError::Missing(vec![format!("{} (a broken link: {e})", path.display())])
            })?;
            if !real.starts_with(self.root) {
                return Err(OutputError::Refused(format!(
                    "{} is a symbolic link to {}, outside the stage's output directory: an output must be the stage's own file (copy it into {})",
                    path.display(),
                    real.display(),
                    self.root.display()
                )));
            }
            if depth > 0 && real.is_dir() {
                return Err(OutputError::Refused(format!(
                    "{} is a symbolic link to a directory inside a declared output directory, which is not followed: declare {} itself",
                    path.display(),
                    real.display()
                )));
            }
        }
        let meta = std::fs::metadata(path)
            .map_err(|e| OutputError::Refused(format!("cannot read {}: {e}", path.display())))?;
        if meta.is_file() {
            if !self.files.iter().any(|f| f == path) {
                if self.files.len() >= MAX_OUTPUT_FILES {
                    return Err(too_many(self.root));
                }
                self.files.push(path.to_path_buf());
            }
            return Ok(());
        }
        if !meta.is_dir() {
            let kind = crate::user_file::non_regular_kind(&meta).unwrap_or("not a file");
            return Err(OutputError::Refused(format!(
                "{} is {kind}: an output must be a regular file, or a directory of them",
                path.display()
            )));
        }
        if depth >= MAX_DEPTH {
            return Err(OutputError::Refused(format!(
                "{} is nested more than {MAX_DEPTH} directories deep",
                path.display()
            )));
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| OutputError::Refused(format!("cannot list {}: {e}", path.display())))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .collect();
        if entries.len() > MAX_OUTPUT_FILES {
            return Err(too_many(self.root));
        }
        entries.sort();
        for entry in entries {
            self.declared(&entry, depth + 1)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NEVER: AtomicBool = AtomicBool::new(false);

    fn paths(records: &[CheckpointRecord], dir: &Path) -> Vec<String> {
        records
            .iter()
            .map(|r| {
                Path::new(&r.path)
                    .strip_prefix(dir)
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_declared_directory_is_recorded_file_by_file() {
        let s = crate::testutil::scratch("outputs-dir");
        let dir = s.join("output");
        std::fs::create_dir_all(dir.join("ckpt/shard")).unwrap();
        std::fs::write(dir.join("ckpt/config.json"), b"{}").unwrap();
        std::fs::write(dir.join("ckpt/shard/0.bin"), b"zero").unwrap();
        std::fs::write(dir.join("loose.txt"), b"x").unwrap();
        std::os::unix::fs::symlink("config.json", dir.join("ckpt/alias.json")).unwrap();
        let records = record(&dir, &["ckpt".into()], false, &[], &NEVER).unwrap();
        assert_eq!(
            paths(&records, &dir),
            ["ckpt/alias.json", "ckpt/config.json", "ckpt/shard/0.bin"]
        );
        assert_eq!(records[2].bytes, 4);
        // "." is the whole output directory, each file once.
        let records = record(&dir, &[".".into(), "loose.txt".into()], false, &[], &NEVER).unwrap();
        assert_eq!(records.len(), 4, "{:?}", paths(&records, &dir));
    }

    #[test]
    fn fifos_devices_and_links_out_of_the_directory_are_refused_without_blocking() {
        let s = crate::testutil::scratch("outputs-hostile");
        let dir = s.join("output");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).unwrap();
        std::fs::write(s.join("secret"), b"not yours").unwrap();
        std::os::unix::fs::symlink(s.join("secret"), dir.join("escape")).unwrap();
        let c = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        for (name, says) in [
            ("zero", "outside the stage's output directory"),
            ("escape", "outside the stage's output directory"),
            (
                "fifo",
                "is a FIFO (named pipe): an output must be a regular file",
            ),
            (".", "outside the stage's output directory"),
        ] {
            let err = record(&dir, &[name.into()], false, &[], &NEVER).unwrap_err();
            assert!(err.to_string().contains(says), "{name}: {err}");
            assert!(
                err.to_string().contains(&dir.display().to_string()),
                "{err}"
            );
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let err = record(&dir, &["none".into()], false, &[], &NEVER).unwrap_err();
        assert!(matches!(err, OutputError::Missing(_)), "{err}");
    }

    #[test]
    fn an_aborted_verification_says_so() {
        let s = crate::testutil::scratch("outputs-abort");
        std::fs::write(s.join("big"), vec![0u8; 1 << 16]).unwrap();
        let abort = AtomicBool::new(true);
        let err = record(&s, &["big".into()], false, &[], &abort).unwrap_err();
        assert!(matches!(err, OutputError::Interrupted), "{err}");
    }
}

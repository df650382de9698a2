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
//! - the hashing gives up within a mebibyte once the caller raises its abort flag;
//! - a declared output counts only if the attempt being judged wrote it: one an earlier attempt
//!   left ([`LeftOver`], found before a retry or a resumed attempt started) and this attempt
//!   did not write, rename onto or touch is missing; a declared directory counts when this
//!   attempt wrote at least one file in it (the rest may be what it resumed from).

use crate::store::checksum::ReportedFile;
use protocol::report::CheckpointRecord;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The most files one attempt's outputs may hold.
pub const MAX_OUTPUT_FILES: usize = 100_000;

/// How deep a declared directory is walked.
const MAX_DEPTH: usize = 64;

/// What tells a file an attempt left alone from one it wrote: writing it, renaming another
/// file onto it, `touch` or `chmod` all change its inode or its change time (which, unlike the
/// modification time, no program can set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
    bytes: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            bytes: meta.size(),
        }
    }
}

/// The declared outputs that earlier attempts left in an output directory, as they were just
/// before the next attempt started (see the module's promises). Empty for an attempt that
/// starts with an empty output directory.
#[derive(Debug, Clone, Default)]
pub struct LeftOver {
    files: HashMap<PathBuf, Stamp>,
}

impl LeftOver {
    /// The regular files the declared outputs (`declared`, relative to `dir`) name now, each
    /// with its stamp. What cannot be read is left out: the attempt's end judges it.
    pub fn find(dir: &Path, declared: &[String]) -> LeftOver {
        let files = std::fs::canonicalize(dir)
            .map(|root| declared_files(dir, &root, declared))
            .unwrap_or_default();
        let files = files
            .into_iter()
            .filter_map(|path| {
                let meta = std::fs::metadata(&path).ok()?;
                Some((path, Stamp::of(&meta)))
            })
            .collect();
        LeftOver { files }
    }

    /// Whether `path` is a file this set holds, as it was (not written since).
    fn unchanged(&self, path: &Path) -> bool {
        self.files.get(path).is_some_and(|stamp| {
            std::fs::metadata(path).is_ok_and(|meta| Stamp::of(&meta) == *stamp)
        })
    }

    /// The declared outputs (of `dir`) that only hold what an earlier attempt left: a file as
    /// it was, a directory none of whose files was written since. Each named for the user.
    fn not_rewritten(&self, dir: &Path, declared: &[String]) -> Vec<String> {
        if self.files.is_empty() {
            return Vec::new();
        }
        let Ok(root) = std::fs::canonicalize(dir) else {
            return Vec::new();
        };
        declared
            .iter()
            .filter(|name| {
                let files = declared_files(dir, &root, std::slice::from_ref(name));
                !files.is_empty() && files.iter().all(|f| self.unchanged(f))
            })
            .map(|name| {
                format!(
                    "{} (left by an earlier attempt; this attempt did not write it: write it again, or, if the stage checked that it is complete, touch it)",
                    dir.join(name).display()
                )
            })
            .collect()
    }
}

/// The regular files that the declared outputs `declared` of `dir` (whose canonical path is
/// `root`) name, as [`record`] walks them; as many as were found before anything unreadable.
fn declared_files(dir: &Path, root: &Path, declared: &[String]) -> Vec<PathBuf> {
    let mut walk = Walk {
        root,
        files: Vec::new(),
    };
    for name in declared {
        let path: PathBuf = dir.join(name).components().collect();
        if walk.declared(&path, 0).is_err() {
            break;
        }
    }
    walk.files
}

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
/// to `dir`) not already recorded. `reported` are the files the stage said it wrote; `left`
/// what earlier attempts left there before this one started (a declared output this attempt
/// did not write is missing); see the module's promises.
pub fn record(
    dir: &Path,
    declared: &[String],
    builtin: bool,
    reported: &[ReportedFile],
    left: &LeftOver,
    abort: &AtomicBool,
) -> Result<Vec<CheckpointRecord>, OutputError> {
    let mut missing: Vec<String> = declared
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| std::fs::metadata(p).is_err() && std::fs::symlink_metadata(p).is_err())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        missing = left.not_rewritten(dir, declared);
    }
    if !missing.is_empty() {
        return Err(OutputError::Missing(missing));
    }
    // The built-in worker is this project's own binary, which hashed its checkpoint as it
    // wrote it: its manifest's files are taken by identity. Anything else is read.
    let written_by_us = if builtin { reported } else { &[] };
    let records = match crate::store::checksum::verify_manifest_dir_until(dir, written_by_us, abort)
    {
        Ok(Some(records)) => records,
        Ok(None) if builtin => return Err(missing_manifest(dir)),
        Ok(None) => Vec::new(),
        Err(crate::store::checksum::VerifyError::Unreadable { source, .. })
            if source.kind() == std::io::ErrorKind::Interrupted =>
        {
            return Err(OutputError::Interrupted)
        }
        Err(why) => return Err(OutputError::Refused(why.to_string())),
    };
    record_declared(dir, declared, reported, abort, records)
}

/// [`record`] for an attempt that declared no outputs and left no earlier attempt's files,
/// whose output directory the caller just saw without a manifest (so it is not looked for
/// again): refused for the built-in worker, which always writes one; else nothing, once the
/// directory is seen to be there. The same verdicts as [`record`]'s.
pub fn record_without_manifest(
    dir: &Path,
    builtin: bool,
) -> Result<Vec<CheckpointRecord>, OutputError> {
    if builtin {
        return Err(missing_manifest(dir));
    }
    record_declared(dir, &[], &[], &AtomicBool::new(false), Vec::new())
}

fn missing_manifest(dir: &Path) -> OutputError {
    OutputError::Missing(vec![dir
        .join(protocol::checkpoint::MANIFEST_FILE)
        .display()
        .to_string()])
}

/// The declared outputs' part of [`record`], after the manifest's files (`records`).
fn record_declared(
    dir: &Path,
    declared: &[String],
    reported: &[ReportedFile],
    abort: &AtomicBool,
    mut records: Vec<CheckpointRecord>,
) -> Result<Vec<CheckpointRecord>, OutputError> {
    let unopenable = |e: std::io::Error| {
        OutputError::Refused(format!(
            "cannot open the output directory {}: {e}",
            dir.display()
        ))
    };
    if declared.is_empty() {
        // Nothing to walk: whether the directory is there is one `stat`, where its canonical
        // path takes a `readlink` per component (a sweep's stages mostly declare nothing).
        std::fs::metadata(dir).map_err(unopenable)?;
        return Ok(records);
    }
    let root = std::fs::canonicalize(dir).map_err(unopenable)?;
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
        let (checksum, bytes) = crate::store::checksum::record_file(&path, reported, abort)
            .map_err(|e| {
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
            let kind = crate::store::user_file::non_regular_kind(&meta).unwrap_or("not a file");
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
        let records = record(
            &dir,
            &["ckpt".into()],
            false,
            &[],
            &LeftOver::default(),
            &NEVER,
        )
        .unwrap();
        assert_eq!(
            paths(&records, &dir),
            ["ckpt/alias.json", "ckpt/config.json", "ckpt/shard/0.bin"]
        );
        assert_eq!(records[2].bytes, 4);
        // "." is the whole output directory, each file once.
        let records = record(
            &dir,
            &[".".into(), "loose.txt".into()],
            false,
            &[],
            &LeftOver::default(),
            &NEVER,
        )
        .unwrap();
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
            let err = record(
                &dir,
                &[name.into()],
                false,
                &[],
                &LeftOver::default(),
                &NEVER,
            )
            .unwrap_err();
            assert!(err.to_string().contains(says), "{name}: {err}");
            assert!(
                err.to_string().contains(&dir.display().to_string()),
                "{err}"
            );
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let err = record(
            &dir,
            &["none".into()],
            false,
            &[],
            &LeftOver::default(),
            &NEVER,
        )
        .unwrap_err();
        assert!(matches!(err, OutputError::Missing(_)), "{err}");
    }

    #[test]
    fn without_a_manifest_the_short_way_gives_the_same_verdicts_as_record() {
        let s = crate::testutil::scratch("outputs-no-manifest");
        let there = s.join("output");
        std::fs::create_dir_all(&there).unwrap();
        let gone = s.join("removed");
        let none = LeftOver::default();
        let verdict = |r: Result<Vec<CheckpointRecord>, OutputError>| match r {
            Ok(records) => format!("ok {}", records.len()),
            Err(e) => format!("{e}"),
        };
        for (dir, builtin) in [
            (&there, false),
            (&there, true),
            (&gone, false),
            (&gone, true),
        ] {
            let long = verdict(record(dir, &[], builtin, &[], &none, &NEVER));
            assert_eq!(verdict(record_without_manifest(dir, builtin)), long);
        }
        assert_eq!(verdict(record_without_manifest(&there, false)), "ok 0");
        assert!(verdict(record_without_manifest(&there, true)).contains("manifest.json"));
        assert!(verdict(record_without_manifest(&gone, false)).contains("cannot open"));
    }

    #[test]
    fn an_aborted_verification_says_so() {
        let s = crate::testutil::scratch("outputs-abort");
        std::fs::write(s.join("big"), vec![0u8; 1 << 16]).unwrap();
        let abort = AtomicBool::new(true);
        let err = record(
            &s,
            &["big".into()],
            false,
            &[],
            &LeftOver::default(),
            &abort,
        )
        .unwrap_err();
        assert!(matches!(err, OutputError::Interrupted), "{err}");
    }
}

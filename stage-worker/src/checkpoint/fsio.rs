//! Durable file writes and checksums, and the record of a file written ([`WrittenFile`]) that
//! the checkpoint writers (the `checkpoint` and `stream` modules, which build on this one)
//! return. That record is what a `checkpoint` event reports, so it is defined with the events
//! and re-exported here.

pub use crate::events::WrittenFile;
use protocol::checkpoint::{Algorithm, Checksum};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// The checksum algorithm this worker writes into manifests and reports:
/// [`Algorithm::PREFERRED`] (BLAKE3), or SHA-256 when `STAGE_WORKER_CHECKSUM=sha256` (for
/// comparisons; readers take either).
pub fn algorithm() -> Algorithm {
    static CHOSEN: std::sync::OnceLock<Algorithm> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| match std::env::var("STAGE_WORKER_CHECKSUM").as_deref() {
        Ok("sha256") => Algorithm::Sha256,
        _ => Algorithm::PREFERRED,
    })
}

/// The checksum of `bytes` under [`algorithm`].
pub fn checksum(bytes: &[u8]) -> Checksum {
    Checksum::of(algorithm(), bytes)
}

/// Flushes a directory's entries (renames, removals) to disk.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `dir/name` so that a reader sees either the old file or the complete new
/// one, never a partial file, even across a crash: a temporary file in the same directory,
/// fsync, rename over the target, fsync the directory.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, dir.join(name))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Puts `bytes` in place at `dir/name` as [`write_atomic`] does (a reader sees the old file or
/// the whole new one), but without waiting for the disk: nothing is fsynced. Returns the open
/// file, for the caller to fsync it (and then the directory) once it must be durable.
pub fn publish(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<File> {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        fs::rename(&tmp, dir.join(name))?;
        Ok(f)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes `dir/name` if it exists and makes the removal durable.
pub fn remove_durably(dir: &Path, name: &str) -> io::Result<()> {
    match fs::remove_file(dir.join(name)) {
        Ok(()) => fsync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let dir = crate::testutil::scratch_dir("atomic");
        write_atomic(&dir, "f.bin", b"one").unwrap();
        write_atomic(&dir, "f.bin", b"two!").unwrap();
        assert_eq!(fs::read(dir.join("f.bin")).unwrap(), b"two!");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        remove_durably(&dir, "f.bin").unwrap();
        remove_durably(&dir, "f.bin").unwrap();
        assert!(!dir.join("f.bin").exists());
    }
}

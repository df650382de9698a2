//! Durable file writes and checksums.

use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of `bytes` ([`protocol::checkpoint::hex`]).
pub fn hex(bytes: &[u8]) -> String {
    protocol::checkpoint::hex(bytes)
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
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

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

//! Reading files a user names (plans, a matrix's `lines`, manifests, declared outputs) without
//! ever blocking or reading without end.
//!
//! Promises:
//! - nothing here blocks in `open()`: a file is opened with `O_NONBLOCK` and checked with
//!   `fstat` before a byte is read, so a FIFO with no writer, a terminal or a device is refused
//!   at once;
//! - only regular files are read, and never more than the caller's limit (a file that grows
//!   while it is read, or a `/proc` file that reports size 0, is still bounded).

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a file a user named was not read.
#[derive(Debug, thiserror::Error)]
pub enum UserFileError {
    /// It could not be opened or read (missing, no permission...).
    #[error("{}", io_text(.0))]
    Io(#[from] std::io::Error),
    /// It is not a regular file (a directory, a FIFO, a device, a socket).
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    /// It holds more than the limit.
    #[error("it is larger than {limit} bytes, more than such a file may be")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

/// "No such file or directory (os error 2)" → "No such file or directory".
fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    }
}

/// What kind of non-regular file `meta` describes, in words ("a FIFO (named pipe)"); `None`
/// for a regular file.
pub fn non_regular_kind(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else {
        Some("not a file")
    }
}

/// Opens the regular file at `path` (following symbolic links) for reading without ever
/// blocking in `open()`, and returns it with its metadata; anything else is refused.
pub fn open_regular(path: &Path) -> Result<(File, Metadata), UserFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if let Some(kind) = non_regular_kind(&meta) {
        return Err(UserFileError::NotRegular(kind));
    }
    Ok((file, meta))
}

/// The contents of the regular file at `path`, at most `limit` bytes: a larger file is
/// refused with [`UserFileError::TooLarge`], a file of any other type with
/// [`UserFileError::NotRegular`].
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, UserFileError> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(UserFileError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(UserFileError::TooLarge { limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_directories_are_refused_at_once() {
        let dir = crate::testutil::scratch("user-file");
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        let err = read_regular(&fifo, 100).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it is a FIFO (named pipe), not a regular file"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let err = read_regular(Path::new("/dev/zero"), 100).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it is a character device, not a regular file"
        );
        let err = read_regular(&dir, 100).unwrap_err();
        assert_eq!(err.to_string(), "it is a directory, not a regular file");
        let err = read_regular(&dir.join("missing"), 100).unwrap_err();
        assert_eq!(err.to_string(), "No such file or directory");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_at_it_is_read() {
        let dir = crate::testutil::scratch("user-file-limit");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_regular(&path, 10).unwrap(), b"0123456789");
        let err = read_regular(&path, 9).unwrap_err();
        assert!(matches!(err, UserFileError::TooLarge { limit: 9 }), "{err}");
        // A file whose size says nothing (procfs reports 0) is bounded by the read itself.
        let err = read_regular(Path::new("/proc/self/maps"), 1).unwrap_err();
        assert!(matches!(err, UserFileError::TooLarge { limit: 1 }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

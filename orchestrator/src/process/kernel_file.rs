//! Reading the small files the kernel generates (`/proc/<pid>/stat`, a cgroup's
//! `cgroup.events`) in one `read`.
//!
//! `std::fs::read_to_string` asks such a file its size (`statx`, which says 0), then reads in
//! growing pieces until a read returns nothing: five to eight system calls for a 300-byte
//! file, several of them at every stage's start and end. The kernel fills a read of these files
//! as far as the buffer allows (`seq_file`), so a read that left room in the buffer had
//! everything: open, one read, close.

use std::io::Read;
use std::path::Path;

/// A read this size holds any of the files above whole (`/proc/<pid>/stat` is at most about
/// 700 bytes; a cgroup's flat-keyed files are shorter).
const ONE_READ: usize = 1024;

/// The text of kernel-generated file `path`; `None` when it cannot be opened or read, or is not
/// UTF-8. Larger files than one read holds are read on to their end.
pub(crate) fn read(path: impl AsRef<Path>) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; ONE_READ];
    let n = loop {
        match file.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    };
    let mut bytes = buf[..n].to_vec();
    if n == ONE_READ {
        file.read_to_end(&mut bytes).ok()?;
    }
    String::from_utf8(bytes).ok()
}

/// The text of kernel-generated file `file`, kept open, read anew: a `pread` from offset 0 has
/// the kernel generate the file again (`seq_file`), so one system call does what [`read`]'s
/// three do. `None` when it cannot be read or is not UTF-8.
pub(crate) fn read_again(file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; ONE_READ];
    let mut bytes = Vec::new();
    loop {
        match file.read_at(&mut buf, bytes.len() as u64) {
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&buf[..n]);
                if n < ONE_READ {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_proc_file_whole_and_a_long_file_to_its_end() {
        let own = read(format!("/proc/{}/stat", std::process::id())).unwrap();
        let stat = crate::process::scan::parse_stat(&own).unwrap();
        assert_eq!(stat.pid, std::process::id() as i32);
        assert!(own.ends_with('\n'));
        let path = std::env::temp_dir().join(format!("kernel-file-{}", std::process::id()));
        let long: String = (0..5000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(&path, &long).unwrap();
        assert_eq!(read(&path).as_deref(), Some(long.as_str()));
        let kept = std::fs::File::open(&path).unwrap();
        assert_eq!(read_again(&kept).as_deref(), Some(long.as_str()));
        assert_eq!(read_again(&kept).as_deref(), Some(long.as_str()));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read(&path), None);
    }
}

//! Reading a checkpoint file whole, at the page cache's speed.
//!
//! A checkpoint just written by the stage before is in the page cache; reading it is a memory
//! copy, and what made `std::fs::read` slow (400 MB in 0.28 s on the H200 host) was the
//! destination: a fresh buffer faults in one 4 KiB page at a time while the kernel copies into
//! it. Here the buffer is advised to use huge pages (a 2 MiB fault each) and several threads
//! read disjoint ranges of it at their own offsets (`pread`).
//!
//! Promise of [`read_file`]: the bytes returned are the file's, in order, as many as its size
//! when the read began; a file that shrinks during the read is an error (`UnexpectedEof`),
//! never a short or zero-padded buffer. (Checkpoint files in place are never changed: a
//! writer replaces them whole, by rename.)

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Ranges smaller than this are not split further: a thread per 32 MiB at least.
const MIN_RANGE: usize = 32 << 20;
/// At most this many reader threads per file.
const MAX_READERS: usize = 4;

/// Reads the file at `path` whole (see the module's promise).
pub fn read_path(path: &Path) -> io::Result<Vec<u8>> {
    read_file(&File::open(path)?)
}

/// Reads the open `file` whole, from its start, with up to [`MAX_READERS`] threads.
pub fn read_file(file: &File) -> io::Result<Vec<u8>> {
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| io::Error::other("file too large for memory"))?;
    let mut buf = huge_page_buffer(len);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let readers = len.div_ceil(MIN_RANGE).clamp(1, MAX_READERS.min(cores));
    if readers == 1 {
        file.read_exact_at(&mut buf, 0)?;
        return Ok(buf);
    }
    // Whole 2 MiB pages per range, so that no page is faulted by two threads.
    let per = len.div_ceil(readers).next_multiple_of(2 << 20);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(k, range)| s.spawn(move || file.read_exact_at(range, (k * per) as u64)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("checkpoint reader thread panicked")))
        })
    })?;
    Ok(buf)
}

/// A zeroed buffer of `len` bytes whose whole 2 MiB pages the kernel is asked to back with
/// huge pages (the allocation is fresh, so no page has been touched yet).
fn huge_page_buffer(len: usize) -> Vec<u8> {
    let buf = vec![0u8; len];
    let page = 2 << 20;
    let start = buf.as_ptr() as usize;
    let aligned = start.next_multiple_of(page);
    let usable = (start + len).saturating_sub(aligned) & !(page - 1);
    if usable > 0 {
        // SAFETY: advice on whole pages inside the buffer's own allocation; it changes no
        // contents and its errors are harmless.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, usable, libc::MADV_HUGEPAGE);
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_byte_in_order_whatever_the_size() {
        let dir = crate::testutil::scratch_dir("fileread");
        // Empty, one short range, and sizes that split into several ranges unevenly.
        for len in [0usize, 5, MIN_RANGE + 3, 3 * MIN_RANGE + (1 << 20) + 7] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
            let path = dir.join(format!("f{len}"));
            std::fs::write(&path, &bytes).unwrap();
            let back = read_path(&path).unwrap();
            assert_eq!(back.len(), len);
            assert!(back == bytes, "{len} bytes read back differently");
        }
    }
}

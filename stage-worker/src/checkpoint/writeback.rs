//! How a checkpoint file's bytes travel from its writers to the disk while it is written.
//!
//! Writing a file fills the page cache; the disk is reached by write-back, which a writer can
//! start itself (`sync_file_range`) or leave to the final fsync. Starting it inside the
//! writer's loop made each 32 MiB write wait for the device queue and halved the rate at which
//! the file reached the page cache (measured on ext4, kernel 6.18: 1.2–1.4 against 2.5 GB/s in
//! one thread); leaving it all to the fsync makes the fsync as long as the whole file's
//! transfer. By default a thread of its own ([`Flusher`]) starts the write-back of each range
//! right after a writer finished it, so the writers run at page-cache speed and the fsync has
//! little left to do.
//!
//! Promises: [`Flusher`] only ever *starts* write-back (`SYNC_FILE_RANGE_WRITE`), it never
//! waits for it, changes no byte and makes nothing durable: durability is the fsync's, as
//! before. Once stopped ([`Flusher::stop`], or dropped), it starts nothing more.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// Who starts the write-back of what the writers put in the page cache
/// (`STAGE_WORKER_WRITEBACK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBack {
    /// A thread of its own, right behind the writers (`behind`, the default).
    Behind,
    /// Each writer, after each of its writes (`inline`: how files were written before).
    Inline,
    /// No one: the final fsync writes everything (`fsync`).
    AtSync,
}

/// How checkpoint files are written: parallel writers per file and who starts write-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteSettings {
    /// Writer threads per file, each writing whole chunks at their own offsets (`pwrite`).
    pub writers: usize,
    /// Who starts the write-back.
    pub write_back: WriteBack,
}

/// The most writer threads per file `STAGE_WORKER_WRITERS` may ask for.
pub const MAX_WRITERS: usize = 16;

impl Default for WriteSettings {
    /// One writer per file and write-back started behind it. (Buffered writes to one file
    /// hold its inode's lock on ext4, XFS and tmpfs alike, so more writers per file only queue
    /// on it: 800 MB in 32 MiB `pwrite`s took 0.27–0.28 s with 1, 2 or 4 threads on ext4,
    /// kernel 6.18. The two files of a checkpoint are written at once, a writer each.)
    fn default() -> Self {
        WriteSettings {
            writers: 1,
            write_back: WriteBack::Behind,
        }
    }
}

impl WriteSettings {
    /// The settings `STAGE_WORKER_WRITERS` (1 to [`MAX_WRITERS`]) and `STAGE_WORKER_WRITEBACK`
    /// (`behind`, `inline` or `fsync`) ask for; a value that is not one of those is an error
    /// naming the variable and what it takes.
    pub fn parse(writers: Option<&str>, write_back: Option<&str>) -> Result<Self, String> {
        let mut s = WriteSettings::default();
        if let Some(w) = writers {
            s.writers = w
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_WRITERS).contains(n))
                .ok_or_else(|| {
                    format!("STAGE_WORKER_WRITERS={w}: expected a count from 1 to {MAX_WRITERS}")
                })?;
        }
        if let Some(b) = write_back {
            s.write_back = match b.trim() {
                "behind" => WriteBack::Behind,
                "inline" => WriteBack::Inline,
                "fsync" => WriteBack::AtSync,
                _ => {
                    return Err(format!(
                        "STAGE_WORKER_WRITEBACK={b}: expected behind, inline or fsync"
                    ))
                }
            };
        }
        Ok(s)
    }

    /// The settings this process's environment asks for, read once; a bad value is logged
    /// (naming the variable) and the default used, so that a typo never costs a stage its
    /// checkpoint.
    pub fn from_env() -> Self {
        static CHOSEN: std::sync::OnceLock<WriteSettings> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let var = |name| std::env::var(name).ok();
            WriteSettings::parse(
                var("STAGE_WORKER_WRITERS").as_deref(),
                var("STAGE_WORKER_WRITEBACK").as_deref(),
            )
            .unwrap_or_else(|e| {
                crate::log!("{e}; using the default");
                WriteSettings::default()
            })
        })
    }
}

/// Starts the write-back of `len` bytes of `file` from `at`, without waiting for it.
pub fn start_write_back(file: &File, at: u64, len: usize) {
    // SAFETY: a plain system call on an open descriptor; its errors are harmless (the fsync
    // writes whatever this did not start).
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            at as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// A thread that starts the write-back of each range it is sent, in order, until it is
/// stopped or every sender is gone.
pub struct Flusher {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread on its own descriptor of `file`; returns it and the sender of ranges
    /// (offset, length).
    pub fn start(file: &File) -> io::Result<(Flusher, mpsc::Sender<(u64, usize)>)> {
        let own = file.try_clone()?;
        let (send, ranges) = mpsc::channel::<(u64, usize)>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::Builder::new()
            .name("ckpt-writeback".into())
            .spawn(move || {
                // Woken now and then to see a stop while a sender is still alive.
                while !stopped.load(Ordering::Acquire) {
                    match ranges.recv_timeout(std::time::Duration::from_millis(20)) {
                        Ok((at, len)) => start_write_back(&own, at, len),
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            })?;
        Ok((
            Flusher {
                stop,
                handle: Some(handle),
            },
            send,
        ))
    }

    /// Starts nothing more and waits for the thread (at most the one call it is in).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Flusher {
    /// A flusher dropped unstopped (a failed write) starts nothing more; its thread ends on
    /// its own.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_values_name_the_variable() {
        assert_eq!(
            WriteSettings::parse(None, None).unwrap(),
            WriteSettings::default()
        );
        let s = WriteSettings::parse(Some("4"), Some("fsync")).unwrap();
        assert_eq!((s.writers, s.write_back), (4, WriteBack::AtSync));
        let s = WriteSettings::parse(Some("1"), Some("inline")).unwrap();
        assert_eq!((s.writers, s.write_back), (1, WriteBack::Inline));
        for bad in ["0", "17", "two", ""] {
            let e = WriteSettings::parse(Some(bad), None).unwrap_err();
            assert!(e.starts_with("STAGE_WORKER_WRITERS="), "{e}");
        }
        let e = WriteSettings::parse(None, Some("later")).unwrap_err();
        assert_eq!(
            e,
            "STAGE_WORKER_WRITEBACK=later: expected behind, inline or fsync"
        );
    }

    #[test]
    fn a_flusher_takes_ranges_until_its_senders_are_gone_or_it_is_stopped() {
        let dir = crate::testutil::scratch_dir("flusher");
        let file = File::create(dir.join("f")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[7u8; 8192], 0).unwrap();
        let (flusher, send) = Flusher::start(&file).unwrap();
        send.send((0, 4096)).unwrap();
        send.send((4096, 4096)).unwrap();
        drop(send);
        // Every sender gone: the thread ends by itself, so the join returns.
        flusher.stop();
        // Stopped while a sender is still alive: the join returns all the same.
        let (flusher, _send) = Flusher::start(&file).unwrap();
        flusher.stop();
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), vec![7u8; 8192]);
    }
}

//! Descriptors and files closed off the scheduling thread: ended attempts' event sockets and
//! started attempts' log files, handed to whoever holds the [`Discards`] list (the preparer's
//! thread), since every `close` on the scheduling thread is a system call between one stage's
//! end and the next one's spawn.

use std::path::PathBuf;
use tokio::net::UnixListener;

/// Ended attempts' sockets and started attempts' log files, for whoever holds the list to
/// close (and remove) (see `EventChannel::remove_later`).
pub type Discards = std::sync::Arc<std::sync::Mutex<Vec<Discarded>>>;

/// What the holder of the [`Discards`] list closes instead of the scheduling thread (each
/// `close` is a system call on the path between one stage's end and the next one's spawn).
#[derive(Debug)]
pub enum Discarded {
    /// An ended attempt's event socket: its file, and its listener when it still has one.
    /// Dropping the listener takes it out of the runtime's `epoll` set and closes it.
    Socket {
        /// The socket file.
        path: PathBuf,
        /// The listener, registered with the runtime.
        listener: Option<UnixListener>,
    },
    /// A started attempt's log files (its processes have their own descriptors of them).
    Logs([std::os::fd::OwnedFd; 2]),
}

impl Discarded {
    /// Closes what it holds and removes the socket file.
    pub fn remove(self) {
        match self {
            Discarded::Socket { path, listener } => {
                drop(listener);
                let _ = std::fs::remove_file(&path);
            }
            Discarded::Logs(files) => drop(files),
        }
    }
}

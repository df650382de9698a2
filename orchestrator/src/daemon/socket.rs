//! The daemon's listening socket: where it lives, how it is created safely, who may connect.
//!
//! Promises: the socket's directory is private (0700, ours); the socket file is created with
//! mode 0600 (the umask is set before `bind`, and `listen` comes after); a stale socket left
//! by a dead daemon is replaced, a live daemon's is refused with a message; one lock file
//! beside the socket makes two daemons starting at once agree on which one serves.

use crate::error::{Context, Error, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The per-user default socket path: `$XDG_RUNTIME_DIR/orchestrate/daemon.sock`, or
/// `/tmp/orchestrate-<uid>/daemon.sock`.
pub fn default_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_dir() => dir.join("orchestrate").join("daemon.sock"),
        _ => PathBuf::from(format!(
            "/tmp/orchestrate-{}",
            nix::unistd::getuid().as_raw()
        ))
        .join("daemon.sock"),
    }
}

/// Creates (or checks) the socket's directory: it must be ours and private.
fn private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let me = nix::unistd::getuid().as_raw();
    if meta.uid() != me {
        return Err(Error::Refused(format!(
            "{} belongs to uid {}, not to this user (uid {me}): choose another --socket",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Error::Refused(format!(
            "{} can be written by other users (mode {:o}): make it 0700 or choose another --socket",
            dir.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

/// A bound, listening socket and the lock that makes this daemon its only server.
pub struct Listening {
    /// The listener.
    pub listener: std::os::unix::net::UnixListener,
    /// The socket's path (removed on drop).
    pub path: PathBuf,
    _lock: File,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the socket at `path`: refuses if a live daemon answers there, replaces a stale one.
pub fn listen(path: &Path) -> Result<Listening> {
    use nix::sys::socket::{
        bind, listen as sys_listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    private_dir(dir)?;
    let lock_path = path.with_extension("lock");
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::Refused(format!(
            "a daemon is already serving {} (it holds {}); stop it with `orchestrate shutdown --socket {}`",
            path.display(),
            lock_path.display(),
            path.display()
        )));
    }
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(Error::Refused(format!(
                "a daemon is already listening on {}; stop it with `orchestrate shutdown --socket {}`",
                path.display(),
                path.display()
            ))),
            Err(_) => {
                tracing::info!(socket = %path.display(), "replacing a stale socket");
                std::fs::remove_file(path)
                    .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
            }
        }
    }
    let fd: OwnedFd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .context("cannot create a socket")?;
    let addr = UnixAddr::new(path).with_context(|| format!("socket path {}", path.display()))?;
    // The mode is decided at bind: with this umask the file is created 0600, before anyone
    // can connect (listen comes after).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = bind(fd.as_raw_fd(), &addr);
    nix::sys::stat::umask(old);
    bound.with_context(|| format!("cannot bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    sys_listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    // SAFETY: `fd` is a listening Unix stream socket that we own; ownership moves.
    let listener = unsafe {
        std::os::unix::net::UnixListener::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd))
    };
    Ok(Listening {
        listener,
        path: path.to_path_buf(),
        _lock: lock,
    })
}

/// Whether a peer with `uid` may use a daemon run by this user: the same user, or root.
pub(crate) fn peer_allowed(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::getuid().as_raw()
}

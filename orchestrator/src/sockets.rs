//! The private directory of a host's event sockets: Unix socket paths are limited to 107
//! bytes, so the sockets cannot live in an arbitrarily deep run directory.

use std::path::{Path, PathBuf};

/// A private directory for event sockets (socket paths are limited to 107 bytes, so they
/// cannot live in an arbitrarily deep run directory). Removed on drop; if this process dies
/// first, the guard removes it, and a later run removes any left by a dead orchestrator.
pub struct SocketDir(PathBuf);

/// The longest socket file name put in a [`SocketDir`] (`<stage index>-<attempt>.sock`).
const SOCKET_NAME_MAX: usize = 24;
/// `sun_path` holds 108 bytes with the terminating NUL.
const SUN_PATH_MAX: usize = 107;

impl SocketDir {
    /// Creates the directory (mode 0700) under the first of `$XDG_RUNTIME_DIR`, `$TMPDIR` and
    /// `/tmp` where a socket path fits.
    pub fn create() -> std::io::Result<SocketDir> {
        use std::os::unix::fs::DirBuilderExt;
        let mut bases: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR") {
            bases.push(PathBuf::from(p));
        }
        bases.push(std::env::temp_dir());
        bases.push(PathBuf::from("/tmp"));
        let pid = std::process::id();
        let base = bases
            .into_iter()
            .filter(|b| b.is_dir())
            .find(|b| {
                let probe = b.join(format!("orchestrate-{pid}-99"));
                probe.as_os_str().len() + 1 + SOCKET_NAME_MAX <= SUN_PATH_MAX
            })
            .ok_or_else(|| {
                std::io::Error::other(
                    "no directory with a path short enough for Unix sockets ($XDG_RUNTIME_DIR, $TMPDIR and /tmp are too long or missing)",
                )
            })?;
        remove_stale(&base);
        for n in 0..100u32 {
            let dir = base.join(format!("orchestrate-{pid}-{n}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(SocketDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("no free socket directory name"))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes socket directories under `base` left by orchestrators of this user that are no
/// longer alive (killed before they could clean up).
fn remove_stale(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let uid = nix::unistd::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("orchestrate-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if ours && !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

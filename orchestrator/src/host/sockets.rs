//! The private directory of a host's event sockets: Unix socket paths are limited to 107
//! bytes, so the sockets cannot live in an arbitrarily deep run directory.

use std::path::{Path, PathBuf};

/// A private directory for event sockets (socket paths are limited to 107 bytes, so they
/// cannot live in an arbitrarily deep run directory). Removed on drop; if this process dies
/// first, the guard removes it, and a later run removes any left by a dead orchestrator.
pub struct SocketDir(PathBuf);

/// The longest socket path put under a [`SocketDir`] (`<run>/<stage index>-<attempt>.sock`).
const SOCKET_NAME_MAX: usize = 32;
/// `sun_path` holds 108 bytes with the terminating NUL.
const SUN_PATH_MAX: usize = 107;

impl SocketDir {
    /// Creates the directory (mode 0700) under the first of `$XDG_RUNTIME_DIR`, `$TMPDIR`,
    /// `/tmp` and `/dev/shm` where a socket path fits, taking those on a memory file system
    /// (tmpfs) first, in that order: binding a socket creates an inode, and its removal at the
    /// stage's end leaves a deleted one; on a disk file system such as ext4 both cost the
    /// scheduling thread file-system work at every stage (ext4 even searches past inodes
    /// deleted in the last minutes when it allocates one), on a memory file system almost
    /// nothing. Where no candidate is on one, the order is kept as it is.
    pub fn create() -> std::io::Result<SocketDir> {
        use std::os::unix::fs::DirBuilderExt;
        let mut bases: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR") {
            bases.push(PathBuf::from(p));
        }
        bases.push(std::env::temp_dir());
        bases.push(PathBuf::from("/tmp"));
        bases.push(PathBuf::from("/dev/shm"));
        // Stable: memory file systems first, each group in the order above.
        bases.sort_by_key(|b| !in_memory(b));
        let pid = std::process::id();
        let mut last_error = None;
        // A base that refuses the directory (a sandbox, a read-only mount) passes to the next.
        for base in bases.into_iter().filter(|b| {
            let probe = b.join(format!("orchestrate-{pid}-99"));
            b.is_dir()
                && probe.as_os_str().len() + 1 + SOCKET_NAME_MAX <= SUN_PATH_MAX
                && writable(b)
        }) {
            // Left by orchestrators of this user killed before they could clean up.
            crate::process::pid_dirs::remove_orphaned(&base, "orchestrate-");
            for n in 0..100u32 {
                let dir = base.join(format!("orchestrate-{pid}-{n}"));
                match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => return Ok(SocketDir(dir)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        last_error = Some(std::io::Error::new(
                            e.kind(),
                            format!("{}: {e}", dir.display()),
                        ));
                        break;
                    }
                }
            }
        }
        Err(last_error.unwrap_or_else(|| {
            std::io::Error::other(
                "no writable directory with a path short enough for Unix sockets ($XDG_RUNTIME_DIR, $TMPDIR, /tmp and /dev/shm are too long, missing or read-only)",
            )
        }))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Creates the directory of run `run`'s sockets (mode 0700), removed with what is in it
    /// when the returned handle is dropped (the host's directory goes with everything left in
    /// it). Runs of one host (the daemon's) number their stages from 0 each: a directory per
    /// run keeps their sockets apart.
    pub fn for_run(&self, run: u64) -> std::io::Result<RunSocketDir> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.0.join(run.to_string());
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", dir.display()),
            )),
            _ => Ok(RunSocketDir(dir)),
        }
    }
}

/// One run's socket directory inside a [`SocketDir`]; removed on drop.
pub struct RunSocketDir(PathBuf);

impl RunSocketDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for RunSocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `dir` is on a file system kept in memory (tmpfs).
pub fn in_memory(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    statfs(dir).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC)
}

/// Whether this process may create entries in `dir`.
fn writable(dir: &Path) -> bool {
    nix::unistd::access(
        dir,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .is_ok()
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_go_to_a_memory_file_system_when_one_is_usable() {
        let dir = SocketDir::create().unwrap();
        assert!(dir.path().is_dir());
        let memory_base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .into_iter()
            .chain([std::env::temp_dir(), "/tmp".into(), "/dev/shm".into()])
            .any(|b| b.is_dir() && in_memory(&b) && writable(&b));
        if memory_base {
            assert!(
                in_memory(dir.path()),
                "{} is on a disk file system though a memory one was usable",
                dir.path().display()
            );
        }
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "removed on drop");
    }

    #[test]
    fn each_run_of_a_host_has_its_own_private_socket_directory() {
        use std::os::unix::fs::PermissionsExt;
        let host = SocketDir::create().unwrap();
        let (run_a, run_b) = (host.for_run(0).unwrap(), host.for_run(1).unwrap());
        let (a, b) = (run_a.path().to_path_buf(), run_b.path().to_path_buf());
        assert_ne!(a, b);
        for dir in [&a, &b] {
            assert!(dir.starts_with(host.path()) && dir.is_dir());
            let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
        // The same stage of two runs gets two sockets.
        assert_ne!(
            crate::attempt::prepare::socket_path(&a, 0, 1),
            crate::attempt::prepare::socket_path(&b, 0, 1)
        );
        let again = host.for_run(1).unwrap();
        assert_eq!(again.path(), b, "asking again is harmless");
        drop(again);
        drop(run_b);
        assert!(
            !b.exists() && a.exists(),
            "a run's directory goes with its run"
        );
        let root = host.path().to_path_buf();
        drop(host);
        assert!(!root.exists());
    }

    #[test]
    fn tmpfs_is_told_from_a_disk_file_system() {
        if Path::new("/proc/self/mounts").exists() {
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
            for line in mounts.lines() {
                let mut fields = line.split(' ');
                let (Some(_), Some(at), Some(kind)) = (fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                if at.contains('\\') || !Path::new(at).is_dir() {
                    continue;
                }
                match kind {
                    "tmpfs" => assert!(in_memory(Path::new(at)), "{at} ({kind})"),
                    "ext4" | "xfs" | "btrfs" => assert!(!in_memory(Path::new(at)), "{at} ({kind})"),
                    _ => {}
                }
            }
        }
    }
}

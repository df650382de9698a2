//! Private directories named for the process that made them (`<prefix><pid>-<anything>`), so
//! that one left behind by a process killed before it could clean up is found and removed by
//! the next process that makes one there.

use std::path::Path;

/// Removes the directories under `base` named `<prefix><pid>-…` that belong to this user and
/// whose process `<pid>` is no longer alive, with everything in them. A name whose part after
/// `prefix` does not start with a process id, an entry that is not a directory, and another
/// user's directory are left alone; so is a directory whose pid is alive, even if that process
/// is not the one that made it (a reused pid keeps a leftover until a later look).
pub fn remove_orphaned(base: &Path, prefix: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let uid = nix::unistd::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // `symlink_metadata`: a link named like ours is not followed into someone's directory.
        let ours =
            std::fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if ours && !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid that no process has: above the kernel's largest (`pid_max` is at most 2^22).
    const DEAD_PID: u32 = 4_194_305;

    #[test]
    fn only_our_directories_of_dead_processes_go() {
        let base = crate::testutil::scratch("pid-dirs");
        let dead = base.path().join(format!("x-step-{DEAD_PID}-17"));
        let live = base
            .path()
            .join(format!("x-step-{}-18", std::process::id()));
        let other_prefix = base.path().join(format!("x-{DEAD_PID}-19"));
        let not_a_pid = base.path().join("x-step-lock");
        let a_file = base.path().join(format!("x-step-{DEAD_PID}-20"));
        for d in [&dead, &live, &other_prefix, &not_a_pid] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(dead.join("events.sock"), b"").unwrap();
        std::fs::write(&a_file, b"").unwrap();

        remove_orphaned(base.path(), "x-step-");

        assert!(!dead.exists(), "a dead process's directory is removed");
        assert!(live.is_dir(), "a live process's directory stays");
        assert!(other_prefix.is_dir(), "another prefix's directory stays");
        assert!(not_a_pid.is_dir(), "a name without a pid stays");
        assert!(a_file.is_file(), "a file is not a private directory");
    }
}

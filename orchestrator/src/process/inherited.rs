//! The descriptors `orchestrate` inherited: kept to itself.
//!
//! A process started by a shell or a CI runner may inherit descriptors beyond stdin, stdout and
//! stderr (a runner's pipe, a shell's own files at high numbers). `std` opens every descriptor
//! of ours close-on-exec, but an inherited one is passed on by every `execve`: without this,
//! every stage, zygote and helper would hold it, and a stage's daemon left running could keep
//! a pipe open that the runner waits on. Python's `subprocess` closes such descriptors in its
//! children by default; here they are marked close-on-exec once, at start-up, and stay open
//! for `orchestrate` itself.

/// Marks every descriptor above stderr close-on-exec, before anything is started: one
/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)` (Linux 5.11), or, where the kernel refuses it,
/// each descriptor `/proc/self/fd` lists. Returns how it was done, for the log.
pub fn keep_to_ourselves() -> &'static str {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it sets a flag on the
    // descriptors of the range that are open.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return "close_range";
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return "none: neither close_range nor /proc/self/fd";
    };
    let listed: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in listed {
        // SAFETY: F_GETFD/F_SETFD on a descriptor number; one closed since the listing (the
        // listing's own) fails harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    "/proc/self/fd"
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A descriptor opened without close-on-exec is close-on-exec afterwards, and still open.
    #[test]
    fn an_inherited_descriptor_is_kept_but_not_passed_on() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.as_raw_fd();
        // SAFETY: clearing the flag on our own open descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        keep_to_ourselves();
        // SAFETY: reading the flags of our own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert!(flags >= 0, "still open");
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "close-on-exec");
    }
}

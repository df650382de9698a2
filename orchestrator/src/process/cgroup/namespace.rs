//! A cgroup namespace per stage, where it confines: each stage's processes are placed in their
//! cgroup, then enter a cgroup namespace rooted there (`unshare(CLONE_NEWCGROUP)`, in the exec
//! path's child, the fork server's and the zygote's intermediate process, and an adopted
//! standby), so that inside it `/proc/self/cgroup` reads `0::/` and, the v2 hierarchy being
//! mounted with `nsdelegate`, the kernel refuses its writes to any `cgroup.procs` outside its
//! subtree.
//!
//! Without `nsdelegate` a namespace confines nothing (a process that may write another
//! cgroup's `cgroup.procs` still can), costs every stage its making and its teardown (5–17 µs
//! of a 600 µs spawn of `/bin/true` on the development machine: `bench/overhead`,
//! `cgroup_spawn.c`), and hides the stage's own path from a program that finds its limits
//! through `/proc/self/cgroup`; so there a stage gets none, unless
//! `ORCHESTRATE_CGROUP_NAMESPACES=always` asks for one wherever the kernel lets
//! ([`Support::per_stage`]).
//!
//! Whether stages get one, or why not, is said here for `orchestrate doctor` and the run's
//! isolation line. Either way a stage cannot leave what contains it: a process that moved
//! itself to another cgroup is still the stage's through the subreaper's view
//! ([`crate::process::tree`]), found, reported and killed with it.

/// What a stage's cgroup namespace does on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The kernel makes one and the hierarchy is mounted with `nsdelegate`: a stage's moves
    /// out of its cgroup are refused by the kernel. Each stage gets one.
    Confining,
    /// The kernel makes one, but without `nsdelegate` it would not stop a privileged stage
    /// from writing itself into another cgroup (it is followed there): a stage gets one only
    /// with `ORCHESTRATE_CGROUP_NAMESPACES=always` ([`Support::per_stage`]).
    NotConfining,
    /// The kernel refused the namespace (the reason): stages run without one.
    Refused(String),
}

impl Support {
    /// What it is on this host, tried once per process (on a thread of its own, which the
    /// namespace it makes goes away with). Waits for [`Support::find_out_early`]'s answer when
    /// that began first.
    pub fn here() -> Support {
        HERE.get_or_init(|| try_here(try_unshare)).clone()
    }

    /// Begins finding out what [`Support::here`] answers, on a short-lived thread, so that a
    /// run's start does not wait for the try (a thread made and ended, which on a machine of
    /// few cores also waits for one while the run's other threads hold them).
    pub fn find_out_early() {
        let started = std::thread::Builder::new()
            .name("cgroupns-probe".into())
            .spawn(|| {
                // This thread ends right after: the namespace it makes goes with it.
                HERE.get_or_init(|| try_here(unshare_here));
            });
        drop(started);
    }

    /// From whether a namespace could be made and whether the hierarchy has `nsdelegate`.
    pub fn from(unshared: Result<(), String>, nsdelegate: bool) -> Support {
        match (unshared, nsdelegate) {
            (Err(why), _) => Support::Refused(why),
            (Ok(()), true) => Support::Confining,
            (Ok(()), false) => Support::NotConfining,
        }
    }

    /// Whether each stage gets a cgroup namespace of its own: where it confines, and where it
    /// does not but the kernel lets and `always` (`ORCHESTRATE_CGROUP_NAMESPACES=always`).
    pub fn per_stage(&self, always: bool) -> bool {
        match self {
            Support::Confining => true,
            Support::NotConfining => always,
            Support::Refused(_) => false,
        }
    }

    /// A phrase for `orchestrate doctor` and the run's isolation line, `always` as for
    /// [`Support::per_stage`].
    pub fn describe(&self, always: bool) -> String {
        match self {
            Support::Confining => {
                "each stage in a cgroup namespace of its own (nsdelegate: moves out of it refused)"
                    .into()
            }
            Support::NotConfining if always => "each stage in a cgroup namespace of its own (no \
                 nsdelegate: a process that moves out is followed through the subreaper)"
                .into(),
            Support::NotConfining => "no cgroup namespace per stage (no nsdelegate: one would \
                 not confine; a process that moves out is followed through the subreaper)"
                .into(),
            Support::Refused(why) => format!(
                "no cgroup namespace per stage ({why}): a process that moves out is followed \
                 through the subreaper"
            ),
        }
    }
}

/// Whether the cgroup v2 hierarchy in `mountinfo` is mounted with `nsdelegate`.
pub fn nsdelegate(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let Some((_, right)) = line.split_once(" - ") else {
            return false;
        };
        let mut fields = right.split_whitespace();
        fields.next() == Some("cgroup2")
            && fields
                .nth(1)
                .is_some_and(|options| options.split(',').any(|o| o == "nsdelegate"))
    })
}

/// [`Support::here`]'s answer, once known.
static HERE: std::sync::OnceLock<Support> = std::sync::OnceLock::new();

/// The answer, with `unshare` the try.
fn try_here(unshare: impl FnOnce() -> Result<(), String>) -> Support {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    Support::from(unshare(), nsdelegate(&mountinfo))
}

/// Whether stages may have a cgroup namespace, tried on a thread made for it, which ends with
/// the namespace it made (namespaces are a thread's).
fn try_unshare() -> Result<(), String> {
    std::thread::spawn(unshare_here)
        .join()
        .unwrap_or_else(|_| Err("the probe failed".into()))
}

/// Makes the calling thread a cgroup namespace of its own: only for a thread that ends next.
fn unshare_here() -> Result<(), String> {
    // SAFETY: unshare takes flags only; it changes the calling (short-lived) thread's namespace.
    match unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } {
        0 => Ok(()),
        _ => Err(format!("unshare: {}", std::io::Error::last_os_error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nsdelegate_is_read_from_the_cgroup2_mount_only() {
        let with = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let without = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                       35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,nsdelegate\n";
        assert!(nsdelegate(with));
        assert!(!nsdelegate(without));
        assert_eq!(Support::from(Ok(()), true), Support::Confining);
        assert_eq!(Support::from(Ok(()), false), Support::NotConfining);
        let refused = Support::from(Err("unshare: EPERM".into()), true);
        assert!(refused
            .describe(true)
            .contains("no cgroup namespace per stage (unshare: EPERM)"));
        // A namespace per stage where it confines; where it does not, only when asked for.
        assert!(Support::Confining.per_stage(false));
        assert!(!Support::NotConfining.per_stage(false));
        assert!(Support::NotConfining.per_stage(true));
        assert!(!refused.per_stage(true));
        assert!(Support::NotConfining
            .describe(false)
            .starts_with("no cgroup namespace per stage (no nsdelegate"));
        assert!(Support::NotConfining
            .describe(true)
            .starts_with("each stage in a cgroup namespace of its own (no nsdelegate"));
    }

    #[test]
    fn the_answer_found_early_is_the_one_a_probe_on_its_own_thread_gives() {
        Support::find_out_early();
        // Known without asking `here` (which would find it out itself): the early probe's.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let early = loop {
            if let Some(found) = HERE.get() {
                break found.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the early probe never answered"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        assert_eq!(early, Support::from(try_unshare(), nsdelegate(&mountinfo)));
        assert_eq!(Support::here(), early);
    }

    #[test]
    fn root_may_make_a_cgroup_namespace() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(try_unshare(), Ok(()));
        }
    }
}

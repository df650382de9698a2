//! Threads whose work no stage waits for, kept off the run's way.
//!
//! A run starts a few threads for work that must be done but that no stage waits for (the
//! plan's fingerprints, the first `report.json` and `plan.resolved.json`). On a machine with
//! few cores they used to take the CPUs that the first stages and the scheduling thread
//! wanted (a scheduler trace on the 2-core development machine showed the first stage of a
//! 1,000-stage chain waiting for a CPU while they ran). [`yield_to_the_run`] lowers the
//! calling thread's CPU priority, so that the kernel gives a CPU to the run's own threads
//! and stages first.
//!
//! Not the lowest priority: a run may wait for these threads in the end (its last
//! `report.json` waits for the first; a resumed run waits for the fingerprints), and an
//! unprivileged process cannot raise a thread's priority again. At nice 10 such a thread
//! still gets about a tenth of a CPU that a nice-0 thread also wants, so a saturated machine
//! delays it, never starves it.

/// The nice value of a thread whose work no stage waits for.
pub(crate) const NICE: i32 = 10;

/// Gives the calling thread the nice value [`NICE`]. Lowering a thread's own priority is
/// always permitted; where the kernel refuses anyway (a seccomp filter) the thread goes on at
/// the priority it had. Only this thread changes: on Linux a thread's nice value is its own.
pub(crate) fn yield_to_the_run() {
    // SAFETY: gettid and setpriority on the calling thread take and return plain integers.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_that_yields_runs_at_a_lower_priority_and_the_others_do_not() {
        // SAFETY: getpriority of this process's threads.
        let of = |tid: libc::pid_t| unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t)
        };
        // SAFETY: gettid has no preconditions.
        let caller = unsafe { libc::gettid() };
        let before = of(caller);
        let seen = std::thread::spawn(move || {
            super::yield_to_the_run();
            // SAFETY: as above.
            of(unsafe { libc::gettid() })
        })
        .join()
        .unwrap();
        assert_eq!(seen, super::NICE.max(before));
        assert_eq!(of(caller), before, "only the calling thread changes");
    }
}

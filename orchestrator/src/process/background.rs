//! Threads whose work no stage waits for, kept off the run's way.
//!
//! A run starts a few threads for work that must be done but that no stage waits for (the
//! plan's fingerprints, the first `report.json` and `plan.resolved.json`). On a machine with
//! few cores they used to take the CPUs that the first stages and the scheduling thread
//! wanted: on a two-core machine the first stage of a 1,000-stage chain waited 1.7 ms for a
//! CPU while they ran. [`yield_to_the_run`] puts the calling thread at the lowest CPU
//! priority, so that the kernel gives the CPU to the run first and to these threads whenever
//! it has nothing else to do.

/// Gives the calling thread the lowest CPU priority (nice 19). Lowering a thread's own
/// priority is always permitted; where the kernel refuses anyway (a seccomp filter) the
/// thread goes on at the priority it had. Only this thread changes: on Linux a thread's
/// nice value is its own.
pub(crate) fn yield_to_the_run() {
    // SAFETY: gettid and setpriority on the calling thread take and return plain integers.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_that_yields_runs_at_the_lowest_priority_and_the_others_do_not() {
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
        assert_eq!(seen, 19);
        assert_eq!(of(caller), before, "only the calling thread changes");
    }
}

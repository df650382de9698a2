//! What a child of the fork server does before it runs anything of a stage: leave the server
//! behind (re-parented to the orchestrator, a session of its own, stdout and stderr the
//! stage's) and take on the stage's environment and working directory. Shared by a forked
//! worker ([`crate::boot::forkserver`]) and a standby ([`crate::boot::standby`]).

use protocol::fork::ForkRequest;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Runs a command line of this program (`argv`, as a worker's `stage-worker --spec …`) in the
/// process that calls it, then exits. `main` hands it down, so a forked worker or an adopted
/// standby runs its stage exactly as an exec'd `stage-worker` would.
pub type CommandLineRunner = fn(&[String]) -> !;

/// In a new child of the server: wait to be re-parented to the request's `parent`, start a
/// session, die with that parent, put `/dev/null` on stdin and `fds[0]`, `fds[1]` on stdout
/// and stderr, close the server's socket and the PID pipe, and clear the signal mask (see the
/// module comment). Exits the process on any failure.
pub fn detach(request: &ForkRequest, fds: &[OwnedFd], server_sock: RawFd, pipe_w: RawFd) {
    crate::log::restart();
    let parent = request.parent as libc::pid_t;
    // Wait until the intermediate has exited and the orchestrator (a subreaper) adopted us.
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: getppid has no preconditions.
    while unsafe { libc::getppid() } != parent {
        if Instant::now() > deadline {
            // SAFETY: leaving without unwinding.
            unsafe { libc::_exit(1) };
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    // SAFETY: plain system calls on this process.
    unsafe {
        if libc::setsid() < 0 {
            libc::_exit(1);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            libc::_exit(1);
        }
        // The orchestrator may have died before the flag was set: then nobody would kill us.
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null < 0
            || libc::dup2(null, 0) < 0
            || libc::dup2(fds[0].as_raw_fd(), 1) < 0
            || libc::dup2(fds[1].as_raw_fd(), 2) < 0
        {
            libc::_exit(1);
        }
        // The server's socket and the PID pipe are not the stage's business. (Every other
        // descriptor of the server is close-on-exec: the server received nothing else.)
        libc::close(server_sock);
        libc::close(pipe_w);
        // Default signal handling and an empty mask, as after exec.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// Replaces this process's environment with `env` and enters `cwd` (exits if it cannot). In a
/// new worker, before anything reads the environment (CUDA_VISIBLE_DEVICES first of all: no
/// CUDA call has been made in this process, or, in a standby, only under the same driver
/// variables).
pub fn take_on(env: &[(String, String)], cwd: &std::path::Path) {
    for (key, _) in std::env::vars_os() {
        std::env::remove_var(key);
    }
    for (key, value) in env {
        std::env::set_var(key, value);
    }
    if let Err(e) = std::env::set_current_dir(cwd) {
        crate::log!("cannot enter {}: {e}", cwd.display());
        std::process::exit(1);
    }
}

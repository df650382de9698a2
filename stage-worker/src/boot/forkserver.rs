//! The fork server (zygote): a long-lived `stage-worker` that has loaded libtorch but never
//! touched a device, and forks a fresh worker process per stage.
//!
//! Starting a worker by `exec` costs loading libtorch again (about 0.3 s on a GPU host). A
//! child forked from a process that already has it loaded starts at once, and is still a
//! fresh process: its own address space, its own CUDA context created after the fork, every
//! byte reclaimed by the OS when it exits. CUDA does not survive `fork`, so the server must
//! never have initialised it; it checks that before every fork and refuses otherwise.
//!
//! How a worker is made (see [`protocol::fork`] for the messages):
//! 1. the server forks an intermediate process, which forks the worker and exits at once, so
//!    the worker is re-parented to the orchestrator (a child subreaper, and the server's
//!    parent): the orchestrator reaps it, gets its exit status and resource usage, and sees it
//!    exactly like a worker it exec'd;
//! 2. the worker waits until its parent is the orchestrator, starts a new session, sets
//!    `PR_SET_PDEATHSIG` (SIGKILL) and re-checks its parent (the orchestrator may have died
//!    in between), takes the stdout and stderr it was sent, closes stdin (`/dev/null`) and
//!    every other inherited descriptor, replaces its environment (so `CUDA_VISIBLE_DEVICES`
//!    and the rest are the stage's before any CUDA call), changes directory, and runs the
//!    stage as `stage-worker --spec …` would.

use crate::boot::fork_messages::{receive_framed, send};
use crate::boot::forked_child::{detach, take_on, CommandLineRunner};
use protocol::fork::{ForkReply, ForkRequest, ENV_SIMULATED_DEVICE_FLAG};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Why this process must not fork workers, if it must not: a device was initialised in it
/// (it holds a handle on the NVIDIA driver, or the CUDA driver says it was initialised, or
/// the simulated flag file exists), or it has more than one thread (a fork would copy locks
/// that other threads hold).
pub fn unfit_to_fork() -> Option<String> {
    if let Some(handle) = nvidia_device_handle() {
        return Some(format!(
            "the fork server holds {handle}: CUDA (or NVML) was initialised in it, and a CUDA \
             context does not survive fork"
        ));
    }
    if cuda_driver_initialised() {
        return Some(
            "the CUDA driver reports it was initialised in the fork server, and a CUDA context \
             does not survive fork"
                .into(),
        );
    }
    if let Some(flag) = std::env::var_os(ENV_SIMULATED_DEVICE_FLAG) {
        if std::path::Path::new(&flag).exists() {
            return Some(format!(
                "a device was initialised in the fork server (simulated: {} exists)",
                std::path::Path::new(&flag).display()
            ));
        }
    }
    let threads = thread_count();
    if threads != 1 {
        return Some(format!(
            "the fork server has {threads} threads; it forks only with one"
        ));
    }
    None
}

/// An open descriptor or a mapping of an NVIDIA device file (`/dev/nvidiactl`, `/dev/nvidia0`,
/// `/dev/nvidia-uvm`…), which `cuInit` (and NVML) open: a process that never initialised CUDA
/// has none. (Merely loading `libcuda.so.1`, which libtorch's CUDA libraries do at load time,
/// opens none.)
fn nvidia_device_handle() -> Option<String> {
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if target.to_string_lossy().starts_with("/dev/nvidia") {
                    return Some(format!("an open {}", target.display()));
                }
            }
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| path.starts_with("/dev/nvidia"))
        .map(|path| format!("a mapping of {path}"))
}

/// Whether the CUDA driver, if it is loaded, has been initialised in this process: any driver
/// call but `cuInit` answers `CUDA_ERROR_NOT_INITIALIZED` (3) before `cuInit`, and asking
/// does not initialise it.
fn cuda_driver_initialised() -> bool {
    type GetCount = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: RTLD_NOLOAD only looks the library up; `cuDeviceGetCount` has this signature in
    // the CUDA driver API and writes one int.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        let f = libc::dlsym(h, c"cuDeviceGetCount".as_ptr());
        let initialised = if f.is_null() {
            true
        } else {
            let get_count: GetCount = std::mem::transmute(f);
            let mut n = 0;
            get_count(&mut n) != 3
        };
        libc::dlclose(h);
        initialised
    }
}

fn thread_count() -> u32 {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count() as u32)
        .unwrap_or(0)
}

/// Runs the fork server on the socket `fd` until end of file. Returns only in the server;
/// a forked worker runs its stage through `run` and exits inside.
pub fn serve(fd: RawFd, run: CommandLineRunner) -> i32 {
    // SAFETY: the descriptor was handed to this process for this purpose and nothing else
    // owns it.
    let mut sock = unsafe { UnixStream::from_raw_fd(fd) };
    // The descriptor must not leak into workers' exec'd programs.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if let Some(reason) = unfit_to_fork() {
        let _ = send(&mut sock, &ForkReply::Refused { reason });
        return 1;
    }
    let ready = ForkReply::Ready {
        pid: std::process::id(),
        threads: thread_count(),
        env_read: Vec::new(),
        left_out: Vec::new(),
        read_ahead: None,
    };
    if send(&mut sock, &ready).is_err() {
        return 1;
    }
    loop {
        let (request, fds) = match receive(&sock) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(e) => {
                let _ = send(
                    &mut sock,
                    &ForkReply::Failed {
                        error: format!("unreadable request: {e}"),
                    },
                );
                return 1;
            }
        };
        if let Some(reason) = unfit_to_fork() {
            let _ = send(&mut sock, &ForkReply::Refused { reason });
            return 1;
        }
        let reply = match fork_worker(&request, fds, sock.as_raw_fd(), run) {
            Ok(pid) => ForkReply::Forked {
                pid,
                lacks: Vec::new(),
            },
            Err(e) => ForkReply::Failed {
                error: e.to_string(),
            },
        };
        if send(&mut sock, &reply).is_err() {
            return 1;
        }
    }
}

/// Reads one request and the descriptors sent with it (two; three for a standby, whose third
/// is its socket); `None` at end of file.
fn receive(sock: &UnixStream) -> io::Result<Option<(ForkRequest, Vec<OwnedFd>)>> {
    let Some((body, fds)) = receive_framed(sock)? else {
        return Ok(None);
    };
    let request: ForkRequest =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let wanted = if request.standby { 3 } else { 2 };
    if fds.len() != wanted {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a request carries {wanted} descriptors, this one {}",
                fds.len()
            ),
        ));
    }
    Ok(Some((request, fds)))
}

/// Forks the worker for `request` through an intermediate process (see the module comment)
/// and returns its PID once it has been re-parented. The worker runs its stage through `run`.
fn fork_worker(
    request: &ForkRequest,
    fds: Vec<OwnedFd>,
    server_sock: RawFd,
    run: CommandLineRunner,
) -> io::Result<u32> {
    if request.v != protocol::PROTOCOL_VERSION {
        return Err(io::Error::other(format!(
            "request of protocol version {}, this stage-worker speaks {}",
            request.v,
            protocol::PROTOCOL_VERSION
        )));
    }
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the server is single-threaded (checked before every fork), so the child may
    // run arbitrary code.
    let intermediate = unsafe { libc::fork() };
    if intermediate < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing descriptors we own.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
        return Err(e);
    }
    if intermediate == 0 {
        // The intermediate: into the stage's cgroup (the worker is born there), fork the
        // worker, report its PID, exit.
        let placed = request.cgroup.as_ref().is_none_or(|dir| {
            let moved = std::fs::write(dir.join("cgroup.procs"), b"0").is_ok();
            // The worker is born in a cgroup namespace rooted at its stage's cgroup when the
            // request says so, where the kernel allows (CAP_SYS_ADMIN); without one otherwise.
            if moved && request.cgroup_namespace {
                // SAFETY: unshare takes flags only; it changes this process's namespaces.
                unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
            }
            moved
        });
        // SAFETY: still single-threaded.
        let worker = if placed { unsafe { libc::fork() } } else { -1 };
        if worker == 0 {
            // SAFETY: closing our copy of the read end.
            unsafe { libc::close(pipe[0]) };
            if request.standby {
                crate::boot::standby::become_standby(request, fds, server_sock, pipe[1], run);
            }
            become_worker(request, fds, server_sock, pipe[1], run);
        }
        let bytes = (worker as i32).to_le_bytes();
        // SAFETY: writing 4 bytes from a live buffer, then leaving without unwinding.
        unsafe {
            libc::write(pipe[1], bytes.as_ptr().cast(), 4);
            libc::_exit(0);
        }
    }
    drop(fds);
    // SAFETY: closing the write end we no longer need.
    unsafe { libc::close(pipe[1]) };
    let mut bytes = [0u8; 4];
    // SAFETY: the read end is ours; File takes it over and closes it.
    let mut reader = unsafe { std::fs::File::from_raw_fd(pipe[0]) };
    let read = reader.read_exact(&mut bytes);
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(intermediate, &mut status, 0) };
    read.map_err(|e| io::Error::other(format!("no PID from the intermediate process: {e}")))?;
    let pid = i32::from_le_bytes(bytes);
    if pid <= 0 {
        return Err(io::Error::other("the intermediate process could not fork"));
    }
    Ok(pid as u32)
}

/// In the new worker: take on the stage's process attributes (see the module comment), run the
/// stage through `run` and exit. Never returns.
fn become_worker(
    request: &ForkRequest,
    fds: Vec<OwnedFd>,
    server_sock: RawFd,
    pipe_w: RawFd,
    run: CommandLineRunner,
) -> ! {
    detach(request, &fds, server_sock, pipe_w);
    // Descriptors 1 and 2 now hold them; the originals are not needed.
    drop(fds);
    take_on(&request.env, &request.cwd);
    crate::log!("started by the fork server (pid {})", std::process::id());
    run(&request.argv)
}

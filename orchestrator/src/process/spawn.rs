//! Starting a stage's first process at a cost that does not grow with the orchestrator.
//!
//! `fork()` copies the parent's page tables, so its cost grows with the orchestrator's memory
//! (a 100,000-stage sweep's state made every spawn slower, and `std::process::Command` forks
//! whenever a `pre_exec` hook is set). [`spawn`] instead clones the calling thread with
//! `CLONE_VM | CLONE_VFORK` (what `posix_spawn` does inside glibc): the child runs on a small
//! stack of its own in the parent's memory, does only system calls, and the parent resumes
//! when the child has called `execve` (or failed to). On x86-64 the clone is a `clone3` with
//! `CLONE_CLEAR_SIGHAND`, so the kernel resets the orchestrator's signal handlers in the child
//! instead of the child asking about every signal (about 70 system calls per spawn, on the
//! path between one stage's end and the next one's start); where `clone3` is refused, plain
//! `clone` and the child's own reset.
//!
//! Promises, the same as the fork path's:
//! - the child is in a new session and process group (`setsid`), with the given stdin, stdout
//!   and stderr and working directory, and exactly the given environment;
//! - it gets SIGKILL when the spawning thread dies (`PR_SET_PDEATHSIG`), and exits at once if
//!   the parent died before that was set;
//! - every signal it inherits is at its default disposition and unblocked, SIGPIPE included
//!   (the orchestrator ignores SIGPIPE; programs expect the default);
//! - nothing it does before `execve` allocates or takes a lock: all it needs is prepared here,
//!   before the clone, and a failure to start comes back as the `errno` of the failing call.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What to start.
pub struct Request<'a> {
    /// Program (a path, or a name looked up in the environment's `PATH`) and arguments.
    pub argv: &'a [String],
    /// The child's environment: the variables of `env_base` that `env` does not set, then
    /// `env`.
    pub env: &'a [(&'a str, &'a str)],
    /// Variables many spawns share, written out once (the orchestrator's own environment).
    pub env_base: Option<&'a EnvBase>,
    /// Its working directory.
    pub cwd: &'a Path,
    /// Its standard input, output and error.
    pub stdin: BorrowedFd<'a>,
    /// See `stdin`.
    pub stdout: BorrowedFd<'a>,
    /// See `stdin`.
    pub stderr: BorrowedFd<'a>,
    /// Whether to ask the kernel for the child's pidfd ([`Spawned::pidfd`]): creating one costs
    /// a few microseconds, wasted when the reaper learns of ends otherwise.
    pub pidfd: bool,
    /// A cgroup's `cgroup.procs`, open for writing: the child moves itself in (writes `0` to
    /// it) before anything else, so that all it runs is in the cgroup; unless it was created
    /// in it (`CLONE_INTO_CGROUP`, Linux 5.7, with [`Request::cgroup_dir`]), which spares the
    /// kernel a migration.
    pub cgroup_procs: Option<BorrowedFd<'a>>,
    /// The cgroup's directory (open for reading), for `CLONE_INTO_CGROUP`.
    pub cgroup_dir: Option<BorrowedFd<'a>>,
    /// With a cgroup: once in it, the child enters a cgroup namespace of its own, rooted at
    /// that cgroup (`unshare(CLONE_NEWCGROUP)`), where the kernel allows (it needs
    /// `CAP_SYS_ADMIN`; refused, the child goes on without one: see
    /// `crate::process::cgroup::namespace`).
    pub cgroup_namespace: bool,
    /// What the child leads: a session of its own (`setsid`, which also makes it the leader of
    /// a process group of its own), or only a process group of its own in the caller's
    /// session (`setpgid(0, 0)`). See [`Leads`].
    pub leads: Leads,
}

/// What a spawned child leads once started: in both forms its pid is its process group's id,
/// and it has no controlling terminal that a process of its own can read (see
/// `crate::process::tree` for which a stage gets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leads {
    /// A session of its own (and its process group): no controlling terminal.
    Session,
    /// A process group of its own in the caller's session. Only where the caller's session has
    /// no controlling terminal: the child then has none either. Spares the child the
    /// scheduler's autogroup that a new session makes (on a kernel with
    /// `CONFIG_SCHED_AUTOGROUP`, a group made and torn down per spawn).
    Group,
}

/// A set of variables written out once as the `KEY=VALUE` strings `execve` takes, for every
/// spawn that passes it ([`Request::env_base`]): a stage inherits the orchestrator's forty-odd
/// variables, and checking and copying each of them was most of a sweep's per-spawn string
/// work.
#[derive(Debug, Default)]
pub struct EnvBase {
    /// `KEY=VALUE\0`, end to end.
    bytes: Vec<u8>,
    /// Each string's place in `bytes`: its start, the end of its key, its end (past the NUL).
    entries: Vec<(usize, usize, usize)>,
    /// Each key and the index in `entries` of its last string: to find the ones a spawn sets
    /// itself, and a key's value without going through every variable (a sweep asks for
    /// `PATH` at every spawn).
    keys: crate::fasthash::FastMap<String, usize>,
}

impl EnvBase {
    /// The variables `vars`, in order; a key or value holding a NUL (which no environment
    /// can carry) or a key holding `=` is left out.
    pub fn new<'v>(vars: impl IntoIterator<Item = (&'v str, &'v str)>) -> EnvBase {
        let mut base = EnvBase::default();
        for (key, value) in vars {
            if key.is_empty() || key.contains(['\0', '=']) || value.contains('\0') {
                continue;
            }
            let start = base.bytes.len();
            base.bytes.extend_from_slice(key.as_bytes());
            let key_end = base.bytes.len();
            base.bytes.push(b'=');
            base.bytes.extend_from_slice(value.as_bytes());
            base.bytes.push(0);
            base.keys.insert(key.to_string(), base.entries.len());
            base.entries.push((start, key_end, base.bytes.len()));
        }
        base
    }

    /// Every variable, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        // Both parts came in as `str`, and the split is at their ends: still UTF-8.
        let text =
            |from: usize, to: usize| std::str::from_utf8(&self.bytes[from..to]).unwrap_or("");
        self.entries
            .iter()
            .map(move |&(start, key_end, end)| (text(start, key_end), text(key_end + 1, end - 1)))
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        let &(_, key_end, end) = self.entries.get(*self.keys.get(key)?)?;
        // The value was a `str` when it came in, and the split is at its ends: still UTF-8.
        std::str::from_utf8(&self.bytes[key_end + 1..end - 1]).ok()
    }
}

/// Everything the child touches, prepared before the clone; the child only reads it, except
/// `error`, where it leaves the `errno` of a failed step.
struct Prepared {
    /// These four point into the spawning thread's [`Strings`], complete before the clone.
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    fds: [libc::c_int; 3],
    parent: libc::pid_t,
    /// The parent's signal mask before a plain clone blocked every signal, restored after it.
    mask: libc::sigset_t,
    error: libc::c_int,
    /// The child's pid, once cloned.
    pid: libc::pid_t,
    /// The kernel already reset every handled signal to its default (`CLONE_CLEAR_SIGHAND`):
    /// the child has only SIGPIPE left to reset.
    handlers_cleared: bool,
    /// Whether `clone3` should give the child's pidfd.
    want_pidfd: bool,
    /// The child's pidfd from `clone3` (close-on-exec), or -1.
    pidfd: libc::c_int,
    /// The `cgroup.procs` the child moves itself into first, or -1.
    cgroup_procs: libc::c_int,
    /// The cgroup directory `clone3` creates the child in, or -1.
    cgroup_dir: libc::c_int,
    /// The child was created in its cgroup: it need not move itself.
    placed: bool,
    /// It enters a cgroup namespace rooted at its cgroup.
    cgroup_namespace: bool,
    /// What it leads.
    leads: Leads,
}

/// A started child.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid.
    pub pid: i32,
    /// Its pidfd, readable once it has ended, when the clone gave one
    /// (`crate::process::reaper::Reaper::watch_pidfd` takes it).
    pub pidfd: Option<std::os::fd::OwnedFd>,
}

thread_local! {
    /// The stack a child of this thread runs on until it execs.
    static CHILD_STACK: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; 64 * 1024].into_boxed_slice());
    /// The strings of this thread's spawns, kept from one to the next.
    static STRINGS: std::cell::RefCell<Strings> = Default::default();
}

/// Every string a spawn passes to the kernel, NUL-terminated, end to end in one buffer, and
/// the pointer arrays into it: one set per thread, reused by each spawn (a sweep spawns
/// thousands of times; a string each was a hundred allocations a spawn, one buffer a spawn
/// still a large allocation each time).
#[derive(Default)]
struct Strings {
    bytes: Vec<u8>,
    starts: Vec<usize>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

/// Starts the program of `req` as described in the module documentation. Must be called on
/// the thread whose life the child's should be tied to.
pub fn spawn(req: &Request<'_>) -> io::Result<Spawned> {
    let Some(program) = req.argv.first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    // The environment's PATH: set by `env`, or else by `env_base`.
    let path_var = match req.env.iter().rev().find(|(k, _)| *k == "PATH") {
        Some((_, v)) => Some(*v),
        None => req.env_base.and_then(|base| base.get("PATH")),
    };
    let (path, cached) = resolve(program, path_var, req.cwd)?;
    match spawn_resolved(req, &path) {
        // The program moved since it was found: look for it again.
        Err(e) if cached && e.raw_os_error() == Some(libc::ENOENT) => {
            forget(program);
            let (path, _) = resolve(program, path_var, req.cwd)?;
            spawn_resolved(req, &path)
        }
        other => other,
    }
}

fn spawn_resolved(req: &Request<'_>, path: &Path) -> io::Result<Spawned> {
    STRINGS.with(|strings| spawn_with(req, path, &mut strings.borrow_mut()))
}

fn spawn_with(req: &Request<'_>, path: &Path, strings: &mut Strings) -> io::Result<Spawned> {
    let Strings {
        bytes,
        starts,
        argv,
        envp,
    } = strings;
    bytes.clear();
    starts.clear();
    // The program's path, the working directory, then every argument and `KEY=VALUE`.
    for part in [path.as_os_str().as_bytes(), req.cwd.as_os_str().as_bytes()] {
        starts.push(bytes.len());
        push_c_string(bytes, &[part])?;
    }
    for arg in req.argv {
        starts.push(bytes.len());
        push_c_string(bytes, &[arg.as_bytes()])?;
    }
    if let Some(base) = req.env_base {
        let offset = bytes.len();
        if req.env.iter().any(|(key, _)| base.keys.contains_key(*key)) {
            for &(start, key_end, end) in &base.entries {
                let key = &base.bytes[start..key_end];
                if req.env.iter().any(|(k, _)| k.as_bytes() == key) {
                    continue;
                }
                starts.push(bytes.len());
                bytes.extend_from_slice(&base.bytes[start..end]);
            }
        } else {
            // Nothing overridden (the usual case): the whole block at once.
            bytes.extend_from_slice(&base.bytes);
            starts.extend(base.entries.iter().map(|&(start, _, _)| offset + start));
        }
    }
    for (key, value) in req.env {
        starts.push(bytes.len());
        push_c_string(bytes, &[key.as_bytes(), b"=", value.as_bytes()])?;
    }
    // The buffer is complete: pointers into it stay valid until it is next cleared, after
    // the clone.
    let at = |start: usize| bytes[start..].as_ptr() as *const libc::c_char;
    let args_end = 2 + req.argv.len();
    argv.clear();
    argv.extend(starts[2..args_end].iter().map(|&s| at(s)));
    argv.push(std::ptr::null());
    envp.clear();
    envp.extend(starts[args_end..].iter().map(|&s| at(s)));
    envp.push(std::ptr::null());
    let mut prepared = Prepared {
        path: at(starts[0]),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: at(starts[1]),
        fds: [
            req.stdin.as_raw_fd(),
            req.stdout.as_raw_fd(),
            req.stderr.as_raw_fd(),
        ],
        parent: crate::process::scan::own_pid(),
        // SAFETY: an all-zero sigset_t is a valid (empty) set; it is overwritten below.
        mask: unsafe { std::mem::zeroed() },
        error: 0,
        pid: 0,
        handlers_cleared: false,
        want_pidfd: req.pidfd,
        pidfd: -1,
        cgroup_procs: req.cgroup_procs.map_or(-1, |fd| fd.as_raw_fd()),
        cgroup_dir: req.cgroup_dir.map_or(-1, |fd| fd.as_raw_fd()),
        placed: false,
        cgroup_namespace: req.cgroup_namespace,
        leads: req.leads,
    };
    // The child's stack: a few system calls need little, but leave room for the vDSO and
    // for signal frames, of which there are none (no handler of ours runs in the child: the
    // kernel reset them, or every signal is blocked until the child did). One
    // per thread, kept: the child uses it only while this thread is suspended in the clone,
    // and a fresh one per spawn cost its page faults every time.
    CHILD_STACK.with(|stack| {
        let mut stack = stack.borrow_mut();
        clone_child(&mut stack, &mut prepared)
    })?;
    // SAFETY: a descriptor the kernel just gave this process, owned by nobody else.
    let pidfd = (prepared.pidfd >= 0).then(|| unsafe {
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(prepared.pidfd)
    });
    if prepared.error != 0 {
        // It exited with 127 without running anything (CLONE_VFORK: it is gone already).
        let mut status = 0;
        // SAFETY: reaping our own ended child.
        unsafe { libc::waitpid(prepared.pid, &mut status, libc::__WALL) };
        return Err(io::Error::from_raw_os_error(prepared.error));
    }
    Ok(Spawned {
        pid: prepared.pid,
        pidfd,
    })
}

/// Appends `parts` and a NUL to `buf`; refuses a part that holds a NUL itself.
fn push_c_string(buf: &mut Vec<u8>, parts: &[&[u8]]) -> io::Result<()> {
    for part in parts {
        if part.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an argument or variable holds a NUL byte",
            ));
        }
        buf.extend_from_slice(part);
    }
    buf.push(0);
    Ok(())
}

/// Clones the child onto `stack` with `prepared`; returns when it has exec'd or exited.
fn clone_child(stack: &mut [u8], prepared: &mut Prepared) -> io::Result<()> {
    // SAFETY: plain libc calls on valid pointers.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(stack.len());
        // 16-byte alignment of the initial stack pointer, as the ABI asks.
        let top = (top as usize & !15) as *mut libc::c_void;
        let arg = prepared as *mut Prepared as *mut libc::c_void;
        // `clone3` resets the child's handlers as it creates it, so no handler of the
        // orchestrator can run on the child's side of the shared memory: signals stay as they
        // are (two system calls fewer on the path between one stage's end and the next one's
        // start).
        let mut pid = clone3::spawn(
            stack.as_mut_ptr(),
            top as usize - stack.as_ptr() as usize,
            arg,
        );
        if pid == -1 {
            // A plain clone keeps the handlers until the child resets them: every signal is
            // blocked across it instead.
            // SAFETY: all-zero is a valid sigset_t; sigfillset initialises it.
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut prepared.mask);
            pid = libc::clone(
                child,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                arg,
            );
            let clone_error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &prepared.mask, std::ptr::null_mut());
            if pid < 0 {
                return Err(clone_error);
            }
        } else if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        pid
    };
    // CLONE_VFORK: the child has exec'd or exited by now, and `error` says which.
    prepared.pid = pid;
    Ok(())
}

/// The child's side: system calls only, on the prepared data.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Prepared` of `spawn`, alive (the parent is suspended) and written
    // by nobody else until this child execs or exits.
    unsafe {
        let p = &mut *(arg as *mut Prepared);
        let fail = |p: &mut Prepared| -> ! {
            p.error = *libc::__errno_location();
            if p.error == 0 {
                p.error = libc::EINVAL;
            }
            libc::_exit(127)
        };
        // Into the stage's cgroup before anything else (its limits hold from here on).
        if p.cgroup_procs >= 0
            && !p.placed
            && libc::write(p.cgroup_procs, b"0".as_ptr().cast(), 1) != 1
        {
            fail(p);
        }
        // Its own cgroup namespace, rooted at the stage's cgroup: `/proc/self/cgroup` reads
        // `0::/`, and where the hierarchy is mounted with `nsdelegate` the kernel refuses its
        // moves out of the cgroup. Not permitted (no CAP_SYS_ADMIN): it goes on without.
        if p.cgroup_namespace && (p.cgroup_procs >= 0 || p.cgroup_dir >= 0) {
            libc::unshare(libc::CLONE_NEWCGROUP);
        }
        // Default dispositions for every signal that has a handler (exec would reset those
        // anyway; this is for the instants before it) and for SIGPIPE, which is ignored here.
        let last = if p.handlers_cleared {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGPIPE, &dfl, std::ptr::null_mut());
            0 // the kernel did the rest
        } else {
            libc::SIGRTMAX()
        };
        for signal in 1..=last {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &dfl, std::ptr::null_mut());
            }
        }
        for (target, &fd) in p.fds.iter().enumerate() {
            let target = target as libc::c_int;
            if fd == target {
                // dup2 onto itself would keep close-on-exec set: clear it.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    fail(p);
                }
            } else if libc::dup2(fd, target) < 0 {
                fail(p);
            }
        }
        if libc::chdir(p.cwd) != 0 {
            fail(p);
        }
        let led = match p.leads {
            Leads::Session => libc::setsid(),
            Leads::Group => libc::setpgid(0, 0),
        };
        if led < 0 {
            fail(p);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            fail(p);
        }
        // The parent may have died before the flag was set: then nobody would kill us.
        if libc::getppid() != p.parent {
            libc::_exit(1);
        }
        // Programs start with no signal blocked.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(p.path, p.argv, p.envp);
        fail(p)
    }
}

thread_local! {
    /// Programs found in `PATH`: (name, `PATH`) → file. A sweep starts the same program
    /// thousands of times; looking it up costs a `stat` per directory of `PATH` each time.
    /// By name: for each `PATH` it was looked up in, the file (looked up without allocating).
    static FOUND: std::cell::RefCell<std::collections::HashMap<String, Vec<(String, PathBuf)>>> =
        Default::default();
}

fn forget(program: &str) {
    FOUND.with(|found| found.borrow_mut().remove(program));
}

/// The file `program` names: itself when it holds a `/`, else the first executable regular file
/// called so in the directories of `path_var`, the environment's `PATH` (the orchestrator's when
/// the environment has none), as `execvp` would find it (remembered per `PATH` when every entry of
/// it is absolute; the second value says the answer came from memory). Relative results are made
/// absolute against `cwd`, where the child will run.
pub(crate) fn resolve(
    program: &str,
    path_var: Option<&str>,
    cwd: &Path,
) -> io::Result<(PathBuf, bool)> {
    if program.contains('/') {
        return Ok((PathBuf::from(program), false));
    }
    // The stage's environment carries PATH (it inherits the orchestrator's); the orchestrator's
    // own is read only for an environment without one.
    let own_path;
    let path_var: &str = match path_var {
        Some(v) => v,
        None => {
            own_path = std::env::var("PATH").ok();
            own_path
                .as_deref()
                .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        }
    };
    let hit = FOUND.with(|found| {
        found.borrow().get(program).and_then(|seen| {
            seen.iter()
                .find(|(path, _)| path == path_var)
                .map(|(_, file)| file.clone())
        })
    });
    if let Some(path) = hit {
        return Ok((path, true));
    }
    let cacheable = path_var.split(':').all(|dir| dir.starts_with('/'));
    let mut denied = false;
    for dir in path_var.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let mut candidate = PathBuf::from(dir).join(program);
        if candidate.is_relative() {
            candidate = cwd.join(candidate);
        }
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if executable(&candidate) {
            if cacheable {
                FOUND.with(|found| {
                    found
                        .borrow_mut()
                        .entry(program.to_string())
                        .or_default()
                        .push((path_var.to_string(), candidate.clone()))
                });
            }
            return Ok((candidate, false));
        }
        denied = true;
    }
    Err(if denied {
        io::Error::from_raw_os_error(libc::EACCES)
    } else {
        io::Error::from_raw_os_error(libc::ENOENT)
    })
}

fn executable(path: &Path) -> bool {
    let Ok(c) = CString::new(OsStr::as_bytes(path.as_os_str())) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// `clone3` with `CLONE_CLEAR_SIGHAND` (Linux 5.5): the kernel resets every handled signal in
/// the child, which saves the child a system call or two per signal (about 70 per spawn).
/// Where it is missing or refused (an older kernel, a seccomp filter), [`spawn`](clone3::spawn)
/// says so once and `clone` is used from then on.
mod clone3 {
    use std::sync::atomic::{AtomicBool, Ordering};

    static UNAVAILABLE: AtomicBool = AtomicBool::new(false);
    /// `CLONE_INTO_CGROUP` was refused once: children move themselves from then on.
    static INTO_CGROUP_UNAVAILABLE: AtomicBool = AtomicBool::new(false);
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

    /// `struct clone_args` of `<linux/sched.h>`, as far as `CLONE_ARGS_SIZE_VER2`.
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

    /// Clones a child running `super::child(arg)` on `stack` (`size` bytes from `stack`, the
    /// top 16-byte aligned), like `clone(CLONE_VM | CLONE_VFORK)`, handlers cleared. Returns
    /// its pid, or -1 when `clone3` cannot be used (then nothing was started).
    ///
    /// # Safety
    /// As `libc::clone`: `arg` must be a `Prepared` that outlives the child's exec, and the
    /// stack must not be in use.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn spawn(stack: *mut u8, size: usize, arg: *mut libc::c_void) -> i32 {
        if UNAVAILABLE.load(Ordering::Relaxed) {
            return -1;
        }
        // SAFETY (the caller's promise): `arg` is the `Prepared` the child reads.
        let prepared = &mut *(arg as *mut super::Prepared);
        prepared.handlers_cleared = true;
        // A pidfd, when asked for, is how the reaper learns that the child ended (see
        // `crate::process::reaper`).
        let pidfd = if prepared.want_pidfd {
            libc::CLONE_PIDFD as u64
        } else {
            0
        };
        // Created in its cgroup where the kernel can (no migration for the child to make).
        let into = prepared.cgroup_dir >= 0 && !INTO_CGROUP_UNAVAILABLE.load(Ordering::Relaxed);
        prepared.placed = into;
        let mut args = CloneArgs {
            flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64
                | pidfd
                | CLONE_CLEAR_SIGHAND
                | if into { CLONE_INTO_CGROUP } else { 0 },
            cgroup: if into { prepared.cgroup_dir as u64 } else { 0 },
            pidfd: &mut prepared.pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: stack as u64,
            stack_size: size as u64,
            ..Default::default()
        };
        let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = super::child;
        let ret: i64;
        // The kernel starts the child after the `syscall` instruction with rax = 0 and its
        // stack pointer at the top of `stack`; it calls the entry (the stack is 16-byte
        // aligned before the call, as the ABI wants) and exits with what it returns, which
        // it never does (it execs or `_exit`s). The parent resumes at `2:` with the pid.
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, 60", // exit
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        if ret < 0 && into {
            // Refused with the cgroup (an older kernel, a cgroup it will not create into):
            // the child moves itself instead, from now on.
            INTO_CGROUP_UNAVAILABLE.store(true, Ordering::Relaxed);
            prepared.placed = false;
            tracing::debug!(
                "CLONE_INTO_CGROUP refused (errno {}); children move themselves",
                -ret
            );
            return spawn(stack, size, arg);
        }
        if ret < 0 {
            prepared.handlers_cleared = false;
            prepared.pidfd = -1;
            let errno = -ret as i32;
            if matches!(
                errno,
                libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM
            ) {
                UNAVAILABLE.store(true, Ordering::Relaxed);
                tracing::debug!("clone3 unavailable (errno {errno}): spawning with clone");
                return -1;
            }
            // A failure clone would share (no memory, too many processes): report it.
            *libc::__errno_location() = errno;
            return -2;
        }
        ret as i32
    }

    /// Elsewhere than x86-64, `clone` it is.
    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn spawn(_: *mut u8, _: usize, _: *mut libc::c_void) -> i32 {
        let _ = &UNAVAILABLE;
        -1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn run(argv: &[&str], env: &[(&str, &str)], cwd: &Path) -> (io::Result<i32>, String) {
        run_with(argv, env, None, cwd, Leads::Session)
    }

    fn run_with(
        argv: &[&str],
        env: &[(&str, &str)],
        env_base: Option<&EnvBase>,
        cwd: &Path,
        leads: Leads,
    ) -> (io::Result<i32>, String) {
        let scratch = crate::testutil::scratch("spawn-out");
        let out_path = scratch.join("out");
        let out = std::fs::File::create(&out_path).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let pid = spawn(&Request {
            argv: &argv,
            env,
            env_base,
            cwd,
            stdin: null.as_fd(),
            stdout: out.as_fd(),
            stderr: out.as_fd(),
            pidfd: false,
            cgroup_procs: None,
            cgroup_dir: None,
            cgroup_namespace: false,
            leads,
        })
        .map(|spawned| spawned.pid);
        if let Ok(pid) = pid {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
        (pid, std::fs::read_to_string(&out_path).unwrap())
    }

    #[test]
    fn the_child_gets_its_environment_directory_session_and_default_signals() {
        let dir = crate::testutil::scratch("spawn");
        let script = "echo \"$FOO $(pwd)\"; \
                      [ \"$(cut -d' ' -f6 /proc/$$/stat)\" = \"$$\" ] && echo session-leader";
        let (pid, out) = run(
            &["sh", "-c", script],
            &[("FOO", "bar"), ("PATH", "/usr/bin:/bin")],
            &dir,
        );
        assert!(pid.is_ok());
        let cwd = std::fs::canonicalize(&dir).unwrap();
        assert!(
            out.starts_with(&format!("bar {}\n", cwd.display())),
            "{out}"
        );
        assert!(out.contains("session-leader"), "{out}");
        // The signal state the program starts with (read by the program itself: a shell
        // blocks signals of its own while it waits for a child).
        let (pid, out) = run(
            &["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"],
            &[("PATH", "/usr/bin:/bin")],
            &dir,
        );
        assert!(pid.is_ok());
        assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
        // SIGPIPE (bit 13) is not ignored in the child although the test harness ignores it.
        let ign = out
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:\t"))
            .unwrap();
        let ign = u64::from_str_radix(ign.trim(), 16).unwrap();
        assert_eq!(ign & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
    }

    #[test]
    fn a_child_that_leads_a_group_is_its_group_in_the_callers_session() {
        let dir = crate::testutil::scratch("spawn-group");
        // Fields 5 and 6 of stat(5): its process group and its session.
        let script = "cut -d' ' -f5,6 /proc/$$/stat; echo $$";
        let (pid, out) = run_with(
            &["sh", "-c", script],
            &[("PATH", "/usr/bin:/bin")],
            None,
            &dir,
            Leads::Group,
        );
        let pid = pid.unwrap();
        // SAFETY: getsid(0) only reads the caller's session id.
        let own_session = unsafe { libc::getsid(0) };
        assert_eq!(out, format!("{pid} {own_session}\n{pid}\n"));
    }

    #[test]
    fn a_shared_environment_comes_first_less_what_the_spawn_sets_and_gives_the_path() {
        let dir = crate::testutil::scratch("spawn-env");
        let base = EnvBase::new([("A", "1"), ("PATH", "/usr/bin:/bin"), ("B", "2")]);
        assert_eq!(base.get("PATH"), Some("/usr/bin:/bin"));
        assert_eq!(base.get("C"), None);
        assert_eq!(
            base.iter().collect::<Vec<_>>(),
            [("A", "1"), ("PATH", "/usr/bin:/bin"), ("B", "2")]
        );
        // `env` is found through the shared PATH; its output is the environment, in order.
        let (pid, out) = run_with(&["env"], &[("C", "4")], Some(&base), &dir, Leads::Session);
        assert!(pid.is_ok());
        assert_eq!(out, "A=1\nPATH=/usr/bin:/bin\nB=2\nC=4\n");
        // A variable the spawn sets replaces the shared one, which is left out.
        let (pid, out) = run_with(
            &["env"],
            &[("B", "3"), ("C", "4")],
            Some(&base),
            &dir,
            Leads::Session,
        );
        assert!(pid.is_ok());
        assert_eq!(out, "A=1\nPATH=/usr/bin:/bin\nB=3\nC=4\n");
        // Its own PATH wins over the shared one for finding the program too.
        let (pid, _) = run_with(
            &["env"],
            &[("PATH", "/nonexistent")],
            Some(&base),
            &dir,
            Leads::Session,
        );
        assert_eq!(pid.unwrap_err().raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn a_missing_program_or_directory_is_an_error_not_a_child() {
        let dir = crate::testutil::scratch("spawn");
        let (pid, _) = run(&["no-such-program-here"], &[("PATH", "/usr/bin")], &dir);
        assert_eq!(pid.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        let (pid, _) = run(&["/bin/true"], &[], &dir.join("missing"));
        assert_eq!(pid.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        for (argv, env) in [
            (["/bin/true", "a\0b"], ("K", "v")),
            (["/bin/true", "x"], ("K", "v\0")),
        ] {
            let (pid, _) = run(&argv, &[env], &dir);
            assert_eq!(pid.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        }
        // A name found once is found again from memory, in the same PATH only.
        let (first, _) = resolve("true", Some("/usr/bin:/bin"), &dir).unwrap();
        let (again, cached) = resolve("true", Some("/usr/bin:/bin"), &dir).unwrap();
        assert_eq!((first, cached), (again, true));
        let (_, cached) = resolve("true", Some("/bin"), &dir).unwrap();
        assert!(!cached);
    }
}

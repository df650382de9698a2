//! `gpu_sharing = "mps"`: stages that share a GPU (`gpu_memory`) as clients of an NVIDIA MPS
//! server that orchestrate runs for that GPU.
//!
//! Processes that share a GPU plainly each make a CUDA context, and the driver makes them one
//! after another (bench/sharing/README.md: four at once wait 399 ms each for the context one
//! makes in 128 ms). Under MPS a client's start is a quarter of that and its kernels run beside
//! the others'. So for each GPU that stages share through MPS, the host runs a control daemon
//! of its own (`nvidia-cuda-mps-control -f`, or `ORCHESTRATE_MPS_CONTROL`):
//! - in a private directory (`mps-<GPU index>/{pipe,log}` in the host's directory of event
//!   sockets, mode 0700), so it never meets the machine's own MPS daemon or another
//!   orchestrate's. The same GPU's daemon has the same directory for as long as the host
//!   lives: its clients' environment is the same from one daemon to the next, so the zygote
//!   and standbys of Python stages (keyed by the environment) serve them all;
//! - seeing that one GPU only (`CUDA_VISIBLE_DEVICES=<uuid>`), so that a fault in one GPU's
//!   clients never stops the clients of another; its clients name it as device 0 (or by UUID);
//! - with its server started before the first client's baseline is read, so that the server's
//!   own memory is never counted as a stage's;
//! - stopped (`quit`, then its session killed if the daemon or its server lingers) once the
//!   GPU's last client stage has been judged, and when the host ends: no MPS server outlives
//!   the stages that used it, and a GPU given whole to the next stage has nothing of MPS on
//!   it. A daemon that ended on its own is replaced at the next client's start, and what it
//!   left (its server) is killed then.
//!
//! A GPU whose daemon cannot be started is shared by time slicing, and each stage's start line
//! says why. The sharing verdict (`gpu::shared`) is unchanged: the driver lists every MPS
//! client with its own memory, and the server as a process that is not the stage's.

use super::GpuInfo;
use crate::process::forkers::Forkers;
use crate::process::reaper::{ExitWait, Reaper};
use crate::process::scan;
use protocol::plan::VisibleDevices;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a control daemon may take to open its control socket.
const START_LIMIT: Duration = Duration::from_secs(15);

/// How long a server asked for ahead may take to start.
const SERVER_LIMIT: Duration = Duration::from_secs(5);

/// How long a started server may take to be listed by the driver (its context made) before
/// the first client goes ahead anyway (a server that makes its context only for its first
/// client is listed from then on, its memory its own).
const LISTED_LIMIT: Duration = Duration::from_secs(3);

/// How long one command to a control daemon (`nvidia-cuda-mps-control` reading it on stdin)
/// may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(5);

/// How long a daemon told to `quit` may take to end before its process group is killed.
const QUIT_LIMIT: Duration = Duration::from_secs(5);

/// The MPS control daemons of a host, one per GPU that stages share through MPS now.
pub struct MpsDaemons {
    program: PathBuf,
    /// Where the daemons' directories are made (the host's private directory).
    root: PathBuf,
    reaper: Reaper,
    /// The host's fork servers and zygotes: their standbys readied under a daemon are killed
    /// before it quits (each would be a client it waits for).
    forkers: Rc<Forkers>,
    daemons: RefCell<BTreeMap<String, Daemon>>,
}

/// A control daemon of one GPU.
struct Daemon {
    pid: i32,
    exit: ExitWait,
    dir: PathBuf,
    /// Stages of the GPU that are its clients and have not been judged yet.
    clients: usize,
}

/// A stage's place among the clients of its GPU's MPS daemon: while it lives the daemon
/// stays; dropping the last one stops it. Drop it once the stage's verdict is made.
pub struct MpsClient {
    daemons: Rc<MpsDaemons>,
    uuid: String,
    /// The daemon it joined (a daemon that replaced it has other clients).
    daemon: i32,
}

impl Drop for MpsClient {
    fn drop(&mut self) {
        self.daemons.leave(&self.uuid, self.daemon);
    }
}

impl MpsDaemons {
    /// No daemon yet; `program` is the control program (see
    /// [`crate::settings::Settings::mps_control`]), `root` a private directory of the host's
    /// where the daemons' directories are made.
    pub fn new(
        program: PathBuf,
        root: PathBuf,
        reaper: Reaper,
        forkers: Rc<Forkers>,
    ) -> MpsDaemons {
        MpsDaemons {
            program,
            root,
            reaper,
            forkers,
            daemons: RefCell::new(BTreeMap::new()),
        }
    }

    /// Makes a stage on `gpu` a client of the GPU's daemon, starting it (and its server) when
    /// none runs: the variables to add to its environment (they replace its
    /// `CUDA_VISIBLE_DEVICES`) and its place among the clients. `Err` says why the GPU has no
    /// daemon; the stage then shares it by time slicing. `server_listed` says whether the
    /// driver lists a process: a new daemon's server is awaited until it is listed (see
    /// [`MpsDaemons::await_server`]).
    pub fn join(
        self: &Rc<Self>,
        gpu: &GpuInfo,
        form: VisibleDevices,
        server_listed: &dyn Fn(u32) -> bool,
    ) -> Result<(Vec<(String, String)>, MpsClient), String> {
        let running = self
            .daemons
            .borrow_mut()
            .get_mut(&gpu.uuid)
            .map(|d| d.exit.try_wait().is_none());
        if running != Some(true) {
            // None, or one that ended on its own (killed, crashed): a fresh one replaces it,
            // what it left (its server) is killed, and the clients of the one it replaces
            // leave nothing when they go.
            let dead = self.daemons.borrow_mut().remove(&gpu.uuid);
            if let Some(dead) = dead {
                tracing::warn!(
                    "the MPS daemon of GPU {} had ended; starting another",
                    gpu.uuid
                );
                self.stop(dead);
            }
            let daemon = self.start(gpu, server_listed)?;
            self.daemons.borrow_mut().insert(gpu.uuid.clone(), daemon);
        }
        let mut daemons = self.daemons.borrow_mut();
        let daemon = daemons.get_mut(&gpu.uuid).expect("started above");
        daemon.clients += 1;
        let visible = match form {
            VisibleDevices::Index => "0".to_string(),
            VisibleDevices::Uuid => gpu.uuid.clone(),
        };
        let env = vec![
            ("CUDA_VISIBLE_DEVICES".to_string(), visible),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                pipe_dir(&daemon.dir).display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                log_dir(&daemon.dir).display().to_string(),
            ),
        ];
        let client = MpsClient {
            daemons: self.clone(),
            uuid: gpu.uuid.clone(),
            daemon: daemon.pid,
        };
        Ok((env, client))
    }

    /// Stops every daemon (the host is done).
    pub fn shutdown(&self) {
        let all = std::mem::take(&mut *self.daemons.borrow_mut());
        for (_, daemon) in all {
            self.stop(daemon);
        }
    }

    /// A client of daemon `pid` of `uuid` was judged: the last one's going stops the daemon.
    fn leave(&self, uuid: &str, pid: i32) {
        let last = {
            let mut daemons = self.daemons.borrow_mut();
            match daemons.get_mut(uuid).filter(|d| d.pid == pid) {
                Some(d) => {
                    d.clients = d.clients.saturating_sub(1);
                    d.clients == 0
                }
                None => false,
            }
        };
        if last {
            if let Some(daemon) = self.daemons.borrow_mut().remove(uuid) {
                self.stop(daemon);
            }
        }
    }

    /// Starts the daemon of `gpu` and its server, and waits until the driver lists the server.
    fn start(&self, gpu: &GpuInfo, server_listed: &dyn Fn(u32) -> bool) -> Result<Daemon, String> {
        let dir = self.root.join(format!("mps-{}", gpu.index));
        // What an earlier daemon of this GPU left (it ended on its own) goes first.
        let _ = std::fs::remove_dir_all(&dir);
        make_private_dirs(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let daemon = self.spawn_daemon(gpu, &dir).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        self.await_server(&daemon, server_listed);
        Ok(daemon)
    }

    /// Spawns `program -f` for `gpu` in `dir` and waits for its control socket.
    fn spawn_daemon(&self, gpu: &GpuInfo, dir: &Path) -> Result<Daemon, String> {
        let out = std::fs::File::create(log_dir(dir).join("control.out"))
            .map_err(|e| format!("cannot create the daemon's log: {e}"))?;
        let mut cmd = Command::new(&self.program);
        cmd.arg("-f")
            .env("CUDA_VISIBLE_DEVICES", &gpu.uuid)
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir(dir))
            .env("CUDA_MPS_LOG_DIRECTORY", log_dir(dir))
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                // A session of its own (its server joins its process group), told to end when
                // this process dies.
                if libc::setsid() < 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "`{}` is not installed here (not on PATH; ORCHESTRATE_MPS_CONTROL names another)",
                self.program.display()
            ),
            _ => format!("`{}` could not be started: {e}", self.program.display()),
        })?;
        let pid = child.id() as i32;
        drop(child);
        // No await since the spawn: the reaper, on this thread, cannot have reaped it.
        let exit = self.reaper.watch(pid);
        scan::note_helper(pid);
        let mut daemon = Daemon {
            pid,
            exit,
            dir: dir.to_path_buf(),
            clients: 0,
        };
        let control = pipe_dir(dir).join("control");
        let mut ended = false;
        crate::process::backoff::poll_blocking(START_LIMIT, Duration::from_millis(5), || {
            self.reaper.reap_now();
            ended = daemon.exit.try_wait().is_some();
            ended || control.exists()
        });
        if !control.exists() {
            let why = if ended {
                format!("the MPS control daemon ended at its start{}", said(dir))
            } else {
                format!(
                    "the MPS control daemon opened no control socket in {} s{}",
                    START_LIMIT.as_secs(),
                    said(dir)
                )
            };
            self.stop(daemon);
            return Err(why);
        }
        Ok(daemon)
    }

    /// Starts the daemon's server for this user, waits up to [`SERVER_LIMIT`] until it runs,
    /// then up to [`LISTED_LIMIT`] until the driver lists it (its context made), so that the
    /// first client's baseline already holds it. A daemon that will not start its server ahead
    /// (an older one) starts it for the first client, as MPS does by itself: that is said in
    /// the log, and its clients go ahead.
    fn await_server(&self, daemon: &Daemon, server_listed: &dyn Fn(u32) -> bool) {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        if let Err(why) = self.command(&daemon.dir, &format!("start_server -uid {uid}")) {
            tracing::warn!(
                "MPS daemon {}: its server starts with its first client: {why}",
                daemon.pid
            );
            return;
        }
        let started = Instant::now();
        let mut server = None;
        crate::process::backoff::poll_blocking(SERVER_LIMIT, Duration::from_millis(10), || {
            server = self
                .command(&daemon.dir, "get_server_list")
                .ok()
                .and_then(|list| list.split_whitespace().find_map(|p| p.parse::<u32>().ok()));
            server.is_some()
        });
        let Some(pid) = server else {
            tracing::warn!(
                "MPS daemon {}: no server after {} s; it starts with its first client{}",
                daemon.pid,
                SERVER_LIMIT.as_secs(),
                said(&daemon.dir)
            );
            return;
        };
        let listed =
            crate::process::backoff::poll_blocking(LISTED_LIMIT, Duration::from_millis(10), || {
                server_listed(pid)
            });
        tracing::info!(
            "MPS daemon {}: server {pid} up after {:.0} ms, {}",
            daemon.pid,
            started.elapsed().as_secs_f64() * 1e3,
            if listed {
                "listed by the driver"
            } else {
                "not listed by the driver yet (it makes its context for its first client)"
            }
        );
    }

    /// Sends `command` to the daemon of `dir` (the control program reading it on stdin) and
    /// returns what it printed. Blocks this thread for at most [`COMMAND_LIMIT`]: the reaper,
    /// on this thread, cannot take the program's exit meanwhile.
    fn command(&self, dir: &Path, command: &str) -> Result<String, String> {
        let mut child = Command::new(&self.program)
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir(dir))
            .env("CUDA_MPS_LOG_DIRECTORY", log_dir(dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("`{}` could not be started: {e}", self.program.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = writeln!(stdin, "{command}");
        }
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if started.elapsed() < COMMAND_LIMIT => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        match status {
            Some(s) if s.success() => Ok(out),
            Some(s) => Err(format!(
                "`{command}` to the MPS daemon failed ({s}): {}",
                out.trim()
            )),
            None => Err(format!(
                "`{command}` to the MPS daemon took over {} s",
                COMMAND_LIMIT.as_secs()
            )),
        }
    }

    /// Tells the daemon to quit (it stops its server) and waits until no process of its
    /// session is left, reaped included (this process is their subreaper); kills what is left
    /// after [`QUIT_LIMIT`], or at once when the daemon had ended on its own (nothing stops its
    /// server then). Removes the daemon's directory.
    fn stop(&self, mut daemon: Daemon) {
        let pipe = pipe_dir(&daemon.dir).display().to_string();
        self.forkers
            .stop_standbys_where("CUDA_MPS_PIPE_DIRECTORY", &pipe);
        let told = daemon.exit.try_wait().is_none();
        if told {
            if let Err(why) = self.command(&daemon.dir, "quit") {
                tracing::warn!("MPS daemon {}: {why}", daemon.pid);
            }
        }
        // The session keeps the daemon's id while any of its processes lives (a server still
        // stopping after its daemon has ended), so the id is no other's meanwhile.
        let sid = daemon.pid;
        let mut session_gone = |limit| {
            crate::process::backoff::poll_blocking(limit, Duration::from_millis(5), || {
                self.reaper.reap_now();
                // The group first: one signal, where the session takes a scan of `/proc`.
                daemon.exit.try_wait().is_some()
                    && scan::group_gone(sid)
                    && scan::session_pids(sid).is_empty()
            })
        };
        if !session_gone(if told { QUIT_LIMIT } else { Duration::ZERO }) {
            if told {
                tracing::warn!(
                    "MPS daemon {sid} or its server did not end in {} s after `quit`: killed",
                    QUIT_LIMIT.as_secs()
                );
            } else {
                tracing::warn!("MPS daemon {sid} had ended, leaving processes: killed");
            }
            for pid in std::iter::once(-sid).chain(scan::session_pids(sid)) {
                // SAFETY: a plain kill: of the daemon's process group (setsid at its start),
                // then of every process of its session, which may have left that group.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if !session_gone(Duration::from_secs(1)) {
                tracing::warn!("MPS daemon {sid}'s session still has processes after a kill");
            }
        }
        scan::forget_helper(daemon.pid);
        let _ = std::fs::remove_dir_all(&daemon.dir);
    }
}

fn pipe_dir(dir: &Path) -> PathBuf {
    dir.join("pipe")
}

fn log_dir(dir: &Path) -> PathBuf {
    dir.join("log")
}

/// Creates `dir` and its `pipe` and `log` directories, readable by this user only.
fn make_private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    builder.create(dir)?;
    builder.create(pipe_dir(dir))?;
    builder.create(log_dir(dir))
}

/// The last line of the server's log, else the daemon's, as ": LINE", or nothing.
fn said(dir: &Path) -> String {
    let logs = log_dir(dir);
    ["server.log", "control.log", "control.out"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(logs.join(f)).ok())
        .filter_map(|text| {
            text.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .next()
        .map(|line| format!(": {}", line.trim()))
        .unwrap_or_default()
}

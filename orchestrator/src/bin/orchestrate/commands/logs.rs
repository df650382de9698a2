//! `orchestrate logs RUN [STAGE] [-f]`: a run's stage logs, followed until the run ends.
//!
//! RUN is a run directory, or a daemon run's id (its directory asked of the daemon). Exit
//! statuses: 0 once everything asked for is printed (with -f: the run has ended); 2 for a run
//! that does not exist or a stage that never started in a run that has ended; 4 when the logs
//! cannot be read or the daemon cannot be reached.

use orchestrator::daemon::client::{Client, V};
use orchestrator::exit;
use orchestrator::store::logs::LogTail;
use orchestrator::store::rundir;
use protocol::daemon::{Request, Response};
use protocol::status::RunStatus;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often a followed log is read again.
const POLL: Duration = Duration::from_millis(200);
/// How often a followed daemon run's state is asked again.
const ASK_DAEMON: Duration = Duration::from_secs(1);

/// Where the run is and who can say whether it is still going.
enum Run {
    /// A run directory: live while a process holds its lock.
    Directory(PathBuf),
    /// A daemon run: live while the daemon says it is queued or running.
    Daemon { dir: PathBuf, id: String },
}

impl Run {
    fn dir(&self) -> &Path {
        match self {
            Run::Directory(dir) | Run::Daemon { dir, .. } => dir,
        }
    }
}

pub(crate) fn logs(run: &str, stage: Option<&str>, follow: bool, socket: &Path) -> ExitCode {
    let run = match find(run, socket) {
        Ok(run) => run,
        Err(code) => return code,
    };
    let mut tail = LogTail::new(run.dir(), stage);
    let mut alive = Liveness::new(&run, socket);
    loop {
        // Asked before reading: lines written before the run ended are all read after it.
        let live = follow && alive.check();
        if let Err(e) = print_new(&mut tail, stage.is_none()) {
            eprintln!(
                "error: cannot read the logs in {}: {e}",
                run.dir().display()
            );
            return ExitCode::from(exit::RUN_ERROR as u8);
        }
        if !live {
            break;
        }
        std::thread::sleep(POLL);
    }
    if let Some(name) = stage.filter(|name| !tail.stage_started(name)) {
        eprintln!(
            "error: stage {name} has no logs in {}: it never started (its name as `orchestrate report` lists it)",
            run.dir().display()
        );
        return ExitCode::from(exit::INVALID_INPUT as u8);
    }
    ExitCode::SUCCESS
}

/// Prints the lines written since the last look, each prefixed with its stage when `prefixed`.
fn print_new(tail: &mut LogTail, prefixed: bool) -> std::io::Result<()> {
    let lines = tail.read_new()?;
    if lines.is_empty() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for line in lines {
        if prefixed {
            writeln!(out, "[{}] {}", line.stage, line.text)?;
        } else {
            writeln!(out, "{}", line.text)?;
        }
    }
    out.flush()
}

/// The run named `run`: a run directory if there is one at that path, else the daemon's run
/// of that id.
fn find(run: &str, socket: &Path) -> Result<Run, ExitCode> {
    let path = Path::new(run);
    if path.exists() {
        return rundir::existing_run(path).map(Run::Directory).map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        });
    }
    let runs = daemon_runs(socket).map_err(|why| {
        eprintln!("error: {run} is not a run directory, and {why}");
        ExitCode::from(exit::INVALID_INPUT as u8)
    })?;
    match runs.into_iter().find(|r| r.id == run) {
        Some(info) => Ok(Run::Daemon {
            dir: PathBuf::from(info.run_dir),
            id: info.id,
        }),
        None => {
            eprintln!(
                "error: {run} is neither a run directory nor a run of the daemon at {}",
                socket.display()
            );
            Err(ExitCode::from(exit::INVALID_INPUT as u8))
        }
    }
}

/// The daemon's runs, or why they cannot be had.
fn daemon_runs(socket: &Path) -> Result<Vec<protocol::daemon::RunInfo>, String> {
    let mut client = Client::connect(socket)
        .map_err(|e| format!("no daemon answers at {}: {e}", socket.display()))?;
    match client.call(&Request::List { v: V }) {
        Ok(Response::Runs { runs, .. }) => Ok(runs),
        Ok(other) => Err(format!("the daemon answered {other:?}")),
        Err(e) => Err(format!("the daemon did not answer: {e}")),
    }
}

/// Whether a followed run is still going, asked no more often than the run's kind needs.
struct Liveness<'a> {
    run: &'a Run,
    socket: &'a Path,
    asked: Option<Instant>,
    live: bool,
}

impl<'a> Liveness<'a> {
    fn new(run: &'a Run, socket: &'a Path) -> Liveness<'a> {
        Liveness {
            run,
            socket,
            asked: None,
            live: true,
        }
    }

    fn check(&mut self) -> bool {
        match self.run {
            Run::Directory(dir) => rundir::live_owner(dir).is_some(),
            Run::Daemon { id, .. } => {
                if self.asked.is_none_or(|at| at.elapsed() >= ASK_DAEMON) {
                    self.asked = Some(Instant::now());
                    self.live = daemon_runs(self.socket).is_ok_and(|runs| {
                        runs.iter().any(|r| {
                            r.id == *id && matches!(r.state, RunStatus::Queued | RunStatus::Running)
                        })
                    });
                }
                self.live
            }
        }
    }
}

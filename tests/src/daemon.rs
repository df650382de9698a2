//! A real `orchestrate daemon` for a test, and raw protocol connections to it.
//!
//! The daemon's stderr (its log) goes to a file the test can read ([`TestDaemon::log`]); it is
//! stopped with SIGTERM when dropped (SIGKILL if it does not end within 30 s).

use crate::{orchestrate, repo_root, wait_for};
pub use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A daemon started for one test.
pub struct TestDaemon {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    /// Its runs directory.
    pub runs: PathBuf,
    log: PathBuf,
}

/// The `--idle-timeout` a test daemon gets unless its test is about that timeout: long enough
/// that a connection a test holds across its other work (a browser's waits, client commands) is
/// not closed under it on a loaded machine.
pub const DEFAULT_IDLE_TIMEOUT: &str = "60s";

impl TestDaemon {
    /// Starts `orchestrate daemon --socket <socket> --runs-dir <runs>` and waits until it
    /// listens; its log goes to `<log>`.
    pub fn start(socket: &Path, runs: &Path, log: &Path) -> TestDaemon {
        Self::start_with(socket, runs, log, DEFAULT_IDLE_TIMEOUT, &[])
    }

    /// [`TestDaemon::start`] in the test's directory `dir`: socket `dir/sock/d.sock`, runs
    /// directory `dir/runs`, log `dir/<log>`.
    pub fn start_in(dir: &Path, log: &str) -> TestDaemon {
        Self::start(&dir.join("sock/d.sock"), &dir.join("runs"), &dir.join(log))
    }

    /// [`TestDaemon::start_with_args`] in the test's directory `dir`, laid out as
    /// [`TestDaemon::start_in`] lays it out (log `dir/daemon.log`).
    pub fn start_in_with(
        dir: &Path,
        idle_timeout: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> TestDaemon {
        let (socket, runs, log) = (
            dir.join("sock/d.sock"),
            dir.join("runs"),
            dir.join("daemon.log"),
        );
        Self::start_with_args(&socket, &runs, &log, idle_timeout, args, env)
    }

    /// [`TestDaemon::start`] with another `--idle-timeout` than [`DEFAULT_IDLE_TIMEOUT`] (how
    /// long a connection may sit in the middle of a request), and `env` added to the daemon's
    /// environment.
    pub fn start_with(
        socket: &Path,
        runs: &Path,
        log: &Path,
        idle_timeout: &str,
        env: &[(&str, &str)],
    ) -> TestDaemon {
        Self::start_with_args(socket, runs, log, idle_timeout, &[], env)
    }

    /// [`TestDaemon::start_with`] with `args` added to the daemon's command line.
    pub fn start_with_args(
        socket: &Path,
        runs: &Path,
        log: &Path,
        idle_timeout: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> TestDaemon {
        let child = Self::command_with(socket, runs, idle_timeout)
            .args(args)
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(log).expect("daemon log file"))
            .spawn()
            .expect("daemon starts");
        let pid = child.id() as i32;
        let mut d = TestDaemon {
            child: Some(child),
            socket: socket.to_path_buf(),
            runs: runs.to_path_buf(),
            log: log.to_path_buf(),
        };
        let listening = wait_for(Duration::from_secs(20), || {
            Conn::try_open(socket).is_some_and(|c| c.hello["pid"] == pid)
        });
        if !listening {
            let status = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            panic!(
                "the daemon does not listen on {} ({status:?}); its log:\n{}",
                socket.display(),
                d.log()
            );
        }
        d
    }

    /// The command that starts a daemon on `socket` and `runs` (stdin and stdout closed).
    pub fn command(socket: &Path, runs: &Path) -> Command {
        Self::command_with(socket, runs, DEFAULT_IDLE_TIMEOUT)
    }

    fn command_with(socket: &Path, runs: &Path, idle_timeout: &str) -> Command {
        let mut cmd = Command::new(orchestrate());
        cmd.arg("daemon")
            .arg("--socket")
            .arg(socket)
            .arg("--runs-dir")
            .arg(runs)
            .args(["--idle-timeout", idle_timeout])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("the daemon runs").id() as i32
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A new connection, past the greeting.
    pub fn connect(&self) -> Conn {
        Conn::try_open(&self.socket).expect("connect to the daemon")
    }

    /// Sends `signal` and waits (up to 30 s) for the daemon to end; how it ended.
    pub fn stop_with(&mut self, signal: Signal) -> ExitStatus {
        let pid = self.pid();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        self.wait_exit()
    }

    /// Waits (up to 30 s) for the daemon to end (a `shutdown`, a signal); how it ended. A
    /// daemon that does not end is killed, and the test fails.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the daemon runs");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the daemon did not end within 30 s");
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.stop_with(Signal::SIGTERM);
            }));
        }
    }
}

/// A raw protocol connection.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The daemon's greeting.
    pub hello: Value,
}

impl Conn {
    /// Connects and reads the greeting; None when nothing answers there.
    pub fn try_open(socket: &Path) -> Option<Conn> {
        let writer = UnixStream::connect(socket).ok()?;
        writer
            .set_read_timeout(Some(Duration::from_secs(60)))
            .ok()?;
        let mut reader = BufReader::new(writer.try_clone().ok()?);
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let hello: Value = serde_json::from_str(&line).ok()?;
        Some(Conn {
            reader,
            writer,
            hello,
        })
    }

    /// Writes `bytes` as they are; false when the daemon closed the connection.
    pub fn send_raw(&mut self, bytes: &[u8]) -> bool {
        self.writer.write_all(bytes).is_ok()
    }

    /// Another handle on the connection's writing side, for a thread that writes while this
    /// one reads the answers.
    pub fn writer(&self) -> UnixStream {
        self.writer
            .try_clone()
            .expect("a second handle on the connection")
    }

    /// The next answer line; None when the connection is closed.
    pub fn read(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).expect("an answer is JSON")),
        }
    }

    /// The next answer line if one comes within `limit`; None when none came or the
    /// connection is closed.
    pub fn read_within(&mut self, limit: Duration) -> Option<Value> {
        self.reader.get_ref().set_read_timeout(Some(limit)).ok()?;
        let answer = self.read();
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(60)));
        answer
    }

    /// Sends one request and reads its answer (within 60 s).
    pub fn call(&mut self, request: Value) -> Value {
        self.call_within(request, Duration::from_secs(60))
    }

    /// Sends one request and reads its answer, which must come within `limit`.
    pub fn call_within(&mut self, request: Value, limit: Duration) -> Value {
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        assert!(self.send_raw(&line), "the daemon closed the connection");
        self.read_within(limit)
            .unwrap_or_else(|| panic!("no answer to {request} within {limit:?}"))
    }

    /// Submits a TOML plan based at `base`; the run's id.
    pub fn submit_toml(&mut self, toml: &str, base: &Path) -> String {
        let answer =
            self.call(json!({"v": 1, "type": "submit", "plan": {"toml": toml}, "base_dir": base}));
        assert_eq!(answer["type"], "submitted", "{answer}");
        answer["id"].as_str().unwrap().to_string()
    }

    /// Waits for run `id` to end; the `wait` answer as it came.
    pub fn wait_answer(&mut self, id: &str) -> Value {
        self.call(json!({"v": 1, "type": "wait", "id": id}))
    }

    /// Waits for run `id` to end; its final state.
    pub fn wait(&mut self, id: &str) -> Value {
        let answer = self.wait_answer(id);
        assert_eq!(answer["type"], "finished", "{answer}");
        answer["run"].clone()
    }

    /// Every run the daemon lists.
    pub fn list(&mut self) -> Vec<Value> {
        let answer = self.call(json!({"v": 1, "type": "list"}));
        answer["runs"].as_array().expect("a list of runs").clone()
    }
}

/// Runs the Python client check `tests/python/<script>` against the daemon listening on
/// `socket`, with `dir` for its files, and asserts that it passed; what it printed.
pub fn run_python_check(script: &str, socket: &Path, dir: &Path) -> String {
    let out = Command::new("python3")
        .arg(repo_root().join("tests/python").join(script))
        .arg(socket)
        .arg(dir)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python client ({script}): {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

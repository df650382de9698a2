//! The preparer: a thread that writes the files of stages about to start (their directories,
//! `inputs.json`, `spec.json`, empty logs; see [`Layout`]) ahead of the scheduler, keeps the
//! logs open and binds the stage's event socket (registered with the runtime), so that a
//! sweep of short stages does not
//! make the scheduling thread wait on the file system between one stage's end and the next
//! one's spawn.
//!
//! Promises: a stage's files are written by exactly one of the preparer and the scheduler, and
//! a stage never starts while the preparer is writing its files: [`Preparer::claim`] waits for
//! a write in progress, and a stage queued but not yet written is taken back and written by
//! the caller. Only first attempts are prepared ahead (a retry's spec differs), and only for
//! the device they were prepared for. At most [`OPEN_AHEAD_MAX`] stages asked to be opened
//! through [`Preparer::may_open`] hold opened files at a time (three descriptors each), and a
//! stage that will not start gives its files back through [`Preparer::release`].
//!
//! The same thread closes and removes the event sockets of the stages it opened once they end (each
//! attempt's [`crate::attempt::channel::EventChannel`] hands its listener and file over instead of
//! closing and removing them on the scheduling thread), before each stage it writes and when the
//! run ends.

use crate::attempt::launch::Opened;
use crate::attempt::prepare::Layout;
use crate::fasthash::FastMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

const NONE: u8 = 0;
const QUEUED: u8 = 1;
const WRITING: u8 = 2;
/// Written, and the output directory was created by the write.
const WRITTEN_FRESH: u8 = 3;
/// Written into an output directory that existed.
const WRITTEN: u8 = 4;
/// Written and opened: its [`Written`] waits in the preparer's table (only stages about to
/// start are opened, so the table stays small; a stage written long ahead costs its state
/// byte only).
const OPENED: u8 = 5;
/// The scheduler took it: the preparer leaves it alone.
const TAKEN: u8 = 6;
/// The write failed: the scheduler writes it (and reports the error).
const FAILED: u8 = 7;

/// How many stages may hold files opened ahead (logs and a bound socket: three descriptors
/// each) before [`Preparer::may_open`] says no.
pub(crate) const OPEN_AHEAD_MAX: usize = 16;

/// Work for the preparer thread: write a stage's files, and open its logs and bind its socket
/// at the path when one is given.
struct Job {
    /// The stage.
    stage: usize,
    /// Its files.
    layout: Layout,
    /// Where to bind its socket, when its files are opened too.
    socket: Option<PathBuf>,
}

/// Where a claim waits while the preparer writes the stage it claims: it sleeps until the
/// preparer says it is done, instead of yielding its CPU in a loop (on a loaded machine the
/// preparer may need that CPU to finish, and each yield is a system call).
#[derive(Default)]
struct Done {
    /// A claim waits (or is about to): the preparer then wakes it after each write.
    waiting: AtomicBool,
    lock: Mutex<()>,
    written: Condvar,
}

impl Done {
    /// Waits until `state` is no longer [`WRITING`].
    fn wait(&self, state: &AtomicU8) {
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.store(true, Ordering::SeqCst);
        while state.load(Ordering::SeqCst) == WRITING {
            guard = self.written.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.waiting.store(false, Ordering::SeqCst);
    }

    /// Wakes a waiting claim, if there is one; called after a write's state was stored. (A
    /// claim sets `waiting` before it looks at the state, under the lock: either it sees the
    /// new state, or this sees `waiting` and takes the lock only once the claim sleeps.)
    fn notify(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.written.notify_all();
        }
    }
}

/// A written stage.
#[derive(Debug)]
pub(crate) struct Written {
    /// Whether its output directory was created by the write (and so is empty).
    pub(crate) fresh: bool,
    /// Its opened files (and the rendezvous port held for it), if it was asked to open them.
    pub(crate) files: Option<Opened>,
}

impl Written {
    /// What its attempt is planned from.
    pub(crate) fn prepared(&self) -> crate::attempt::prepare::Prepared {
        crate::attempt::prepare::Prepared {
            fresh: self.fresh,
            port: self
                .files
                .as_ref()
                .and_then(|f| f.port.as_ref())
                .map(|p| p.port()),
        }
    }
}

/// Handle to the preparer thread of one run.
pub(crate) struct Preparer {
    state: Arc<Vec<AtomicU8>>,
    /// Opened stages not yet claimed.
    written: Arc<Mutex<FastMap<usize, Written>>>,
    /// Stages queued to be opened whose files are neither claimed nor given up yet.
    opening: Arc<AtomicUsize>,
    /// Wakes a claim waiting for a write in progress.
    done: Arc<Done>,
    jobs: Option<mpsc::Sender<Vec<Job>>>,
    /// Jobs queued since the last [`Preparer::flush`]: handed over together, one wake-up of
    /// the thread per batch (a message each cost the scheduling thread two futex calls).
    pending: std::cell::RefCell<Vec<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Socket files of ended attempts and log files of started ones, closed (and removed) by
    /// the thread.
    discards: crate::process::discard::Discards,
}

impl Preparer {
    /// A preparer for a run of `stages` stages; the event sockets it binds are registered
    /// with `runtime` (the scheduling thread's).
    pub(crate) fn start(
        stages: usize,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<Preparer> {
        let state: Arc<Vec<AtomicU8>> =
            Arc::new((0..stages).map(|_| AtomicU8::new(NONE)).collect());
        let (jobs, queue) = mpsc::channel::<Vec<Job>>();
        let theirs = state.clone();
        let written: Arc<Mutex<FastMap<usize, Written>>> = Arc::default();
        let table = written.clone();
        let opening = Arc::new(AtomicUsize::new(0));
        let open_count = opening.clone();
        let done = Arc::new(Done::default());
        let wake = done.clone();
        let discards = crate::process::discard::Discards::default();
        let to_remove = discards.clone();
        let thread = std::thread::Builder::new()
            .name("stage-files".into())
            .spawn(move || {
                for Job {
                    stage: i,
                    layout,
                    socket,
                } in queue.into_iter().flatten()
                {
                    remove_all(&to_remove);
                    if theirs[i]
                        .compare_exchange(QUEUED, WRITING, Ordering::SeqCst, Ordering::Acquire)
                        .is_err()
                    {
                        // Taken back by the scheduler: nothing of it is opened.
                        if socket.is_some() {
                            open_count.fetch_sub(1, Ordering::AcqRel);
                        }
                        continue;
                    }
                    let result = match &socket {
                        Some(socket) => layout
                            .write_and_open(socket, &runtime)
                            .map(|(fresh, files)| (fresh, Some(files))),
                        None => layout.write().map(|fresh| (fresh, None)),
                    };
                    let state = match result {
                        Ok((fresh, None)) => {
                            if fresh {
                                WRITTEN_FRESH
                            } else {
                                WRITTEN
                            }
                        }
                        Ok((fresh, Some(mut files))) => {
                            files.discards = Some(to_remove.clone());
                            let written = Written {
                                fresh,
                                files: Some(files),
                            };
                            table
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(i, written);
                            OPENED
                        }
                        Err(_) => {
                            if socket.is_some() {
                                open_count.fetch_sub(1, Ordering::AcqRel);
                            }
                            FAILED
                        }
                    };
                    theirs[i].store(state, Ordering::SeqCst);
                    wake.notify();
                }
            })?;
        Ok(Preparer {
            state,
            written,
            opening,
            done,
            jobs: Some(jobs),
            pending: Default::default(),
            thread: Some(thread),
            discards,
        })
    }

    /// Whether stage `i` was never handed to the preparer.
    pub(crate) fn untouched(&self, i: usize) -> bool {
        self.state[i].load(Ordering::Acquire) == NONE
    }

    /// Whether stage `i`'s files are written and not claimed yet (a claim returns them at once).
    pub(crate) fn written(&self, i: usize) -> bool {
        matches!(
            self.state[i].load(Ordering::Acquire),
            WRITTEN_FRESH | WRITTEN | OPENED
        )
    }

    /// Whether fewer than [`OPEN_AHEAD_MAX`] stages hold (or are about to hold) files opened
    /// ahead: asking for more than that is left to the stages about to start.
    pub(crate) fn may_open(&self) -> bool {
        self.opening.load(Ordering::Acquire) < OPEN_AHEAD_MAX
    }

    /// Hands stage `i`'s first-attempt files to the preparer (with the next
    /// [`Preparer::flush`]); with `socket`, it also opens the logs and binds the event socket
    /// there (for a stage about to start: each holds three file descriptors until it is
    /// claimed or released). Until the flush the stage counts as queued: a claim takes it back.
    pub(crate) fn queue(&self, i: usize, layout: Layout, socket: Option<PathBuf>) {
        if self.state[i]
            .compare_exchange(NONE, QUEUED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if socket.is_some() {
                self.opening.fetch_add(1, Ordering::AcqRel);
            }
            self.pending.borrow_mut().push(Job {
                stage: i,
                layout,
                socket,
            });
        }
    }

    /// Hands the stages queued since the last flush to the thread, in one message.
    pub(crate) fn flush(&self) {
        let batch = std::mem::take(&mut *self.pending.borrow_mut());
        if batch.is_empty() {
            return;
        }
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(batch));
        if let Some(Err(mpsc::SendError(batch))) = sent {
            // The thread is gone: nothing of these will be written by it.
            for job in batch {
                self.state[job.stage].store(NONE, Ordering::Release);
                if job.socket.is_some() {
                    self.opening.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Gives back what was prepared for stage `i`, which will not start in this run (an
    /// upstream stage failed): its opened logs are closed and its socket removed; files it
    /// wrote stay. The preparer leaves it alone from now on.
    pub(crate) fn release(&self, i: usize) {
        if let Some(Written {
            files: Some(files), ..
        }) = self.claim(i)
        {
            files.give_back();
        }
    }

    /// Takes stage `i` for starting: what the preparer wrote, `None` when the caller must
    /// write its files. Waits while the preparer is writing them.
    pub(crate) fn claim(&self, i: usize) -> Option<Written> {
        loop {
            match self.state[i].compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return None,
                Err(WRITING) => self.done.wait(&self.state[i]),
                Err(WRITTEN_FRESH) => {
                    self.state[i].store(TAKEN, Ordering::Release);
                    return Some(Written {
                        fresh: true,
                        files: None,
                    });
                }
                Err(WRITTEN) => {
                    self.state[i].store(TAKEN, Ordering::Release);
                    return Some(Written {
                        fresh: false,
                        files: None,
                    });
                }
                Err(OPENED) => {
                    self.state[i].store(TAKEN, Ordering::Release);
                    self.opening.fetch_sub(1, Ordering::AcqRel);
                    return self
                        .written
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&i);
                }
                Err(_) => {
                    self.state[i].store(TAKEN, Ordering::Release);
                    return None;
                }
            }
        }
    }
}

impl Drop for Preparer {
    fn drop(&mut self) {
        // What is still queued will not start in this run: leave it unwritten. Closing the
        // queue then ends the thread.
        for state in self.state.iter() {
            let _ = state.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire);
        }
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        remove_all(&self.discards);
        // Sockets bound for stages that did not start.
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        for (_, written) in written.drain() {
            if let Some(files) = written.files {
                files.give_back();
            }
        }
    }
}

/// Closes the listeners and log files and removes the socket files in `discards`.
fn remove_all(discards: &crate::process::discard::Discards) {
    let ended = std::mem::take(&mut *discards.lock().unwrap_or_else(|e| e.into_inner()));
    for discarded in ended {
        discarded.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{parse_plan_toml, LoadedPlan};
    use crate::store::rundir::RunDir;
    use protocol::worker::Device;
    use std::os::fd::AsRawFd;
    use std::path::Path;

    /// A scratch run directory and a plan of `n` independent stages `s0`, `s1`, ….
    fn stages(scratch: &str, n: usize) -> (crate::testutil::Scratch, RunDir, LoadedPlan) {
        let dir = crate::testutil::scratch(scratch);
        let run_dir = RunDir::create(&dir).unwrap();
        let text: String = (0..n)
            .map(|i| format!("[[stage]]\nname = \"s{i}\"\ncommand = [\"true\"]\n"))
            .collect();
        let plan = parse_plan_toml(&text, "t.toml", Path::new("/")).unwrap();
        (dir, run_dir, plan)
    }

    /// Stage `i`'s files for its first attempt on the CPU.
    /// The runtime the preparer registers event sockets with.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    fn layout(plan: &LoadedPlan, run_dir: &RunDir, i: usize) -> Layout {
        let inputs = Layout::inputs_of(plan, i, run_dir);
        Layout::new(plan, i, run_dir, 1, Device::Cpu, inputs)
    }

    #[test]
    fn every_stage_is_written_once_by_one_side_and_claims_say_so() {
        let (dir, run_dir, plan) = stages("prepare", 200);
        let layout = |i: usize| layout(&plan, &run_dir, i);
        let runtime = runtime();
        let preparer = Preparer::start(200, runtime.handle().clone()).unwrap();
        // Odd stages are queued; even ones never are.
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let socket = |i: usize| crate::attempt::prepare::socket_path(&sockets, i, 1);
        for i in (1..200).step_by(2) {
            // Every other one opens its logs and binds its socket too.
            preparer.queue(i, layout(i), (i % 4 == 1).then(|| socket(i)));
        }
        preparer.flush();
        assert!(preparer.untouched(0) && !preparer.untouched(1));
        // The preparer writes in queue order: once the last queued stage's logs exist, it has
        // written (or is finishing) every queued stage.
        let last = run_dir.stage_dir("s199").join("stderr.log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !last.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the preparer wrote nothing"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut by_preparer = 0;
        for i in 0..200 {
            match preparer.claim(i) {
                Some(Written {
                    fresh,
                    files: opened,
                }) => {
                    assert!(i % 2 == 1, "stage {i} was never queued");
                    assert!(fresh, "a new run's output directories are new");
                    assert_eq!(opened.is_some(), i % 4 == 1);
                    if let Some(opened) = opened {
                        assert_eq!(opened.socket, socket(i));
                        assert_eq!(opened.stderr_offset, 0);
                        // The socket listens: a stage could connect to it now.
                        std::os::unix::net::UnixStream::connect(socket(i)).unwrap();
                        // Its rendezvous port is held: no one else can bind it until the
                        // attempt spawns (these files are dropped here instead).
                        let port = opened.port.as_ref().expect("a port is held").port();
                        let any = std::net::Ipv4Addr::UNSPECIFIED;
                        assert!(std::net::TcpListener::bind((any, port)).is_err());
                        drop(opened);
                        std::net::TcpListener::bind((any, port)).unwrap();
                    }
                    by_preparer += 1;
                }
                None => layout(i).write().map(|_| ()).unwrap(),
            }
            let stage_dir = run_dir.stage_dir(&format!("s{i}"));
            for file in [
                "spec.json",
                "inputs.json",
                "stdout.log",
                "stderr.log",
                "output",
            ] {
                assert!(stage_dir.join(file).exists(), "s{i}/{file}");
            }
            // Once claimed, the preparer never touches it again.
            preparer.queue(i, layout(i), Some(socket(i)));
            preparer.flush();
            assert!(preparer.claim(i).is_none());
        }
        drop(preparer);
        assert_eq!(
            by_preparer, 100,
            "every queued stage was written by the preparer"
        );
        let spec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(run_dir.stage_dir("s7").join("spec.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(spec["stage"], "s7");
        assert_eq!(spec["attempt"], 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ended_stages_sockets_are_removed_by_the_thread_with_its_next_work_or_at_the_end() {
        let (dir, run_dir, plan) = stages("prepare-discard", 3);
        let layout = |i: usize| layout(&plan, &run_dir, i);
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let socket = |i: usize| crate::attempt::prepare::socket_path(&sockets, i, 1);
        let runtime = runtime();
        let preparer = Preparer::start(3, runtime.handle().clone()).unwrap();
        preparer.queue(0, layout(0), Some(socket(0)));
        preparer.flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let claimed = loop {
            match preparer.claim(0) {
                Some(Written {
                    files: Some(files), ..
                }) => break files,
                _ if std::time::Instant::now() < deadline => {
                    // Not written yet, and taken back: queue it again (the claim took it).
                    preparer.state[0].store(NONE, Ordering::Release);
                    preparer.queue(0, layout(0), Some(socket(0)));
                    preparer.flush();
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                other => panic!("stage 0 was never opened: {other:?}"),
            }
        };
        // What an attempt does once its process has the log files, and what its channel does
        // when it ends: hand them over.
        let discards = claimed
            .discards
            .clone()
            .expect("opened ahead: removal is deferred");
        let open_logs = |fds: &[i32]| {
            fds.iter()
                .filter(|fd| {
                    std::fs::read_link(format!("/proc/self/fd/{fd}"))
                        .is_ok_and(|p| p.starts_with(run_dir.stage_dir("s0")))
                })
                .count()
        };
        let log_fds = [&claimed.stdout, &claimed.stderr].map(|f| f.as_raw_fd());
        assert_eq!(open_logs(&log_fds), 2);
        discards
            .lock()
            .unwrap()
            .push(crate::process::discard::Discarded::Logs([
                claimed.stdout.into(),
                claimed.stderr.into(),
            ]));
        discards
            .lock()
            .unwrap()
            .push(crate::process::discard::Discarded::Socket {
                path: socket(0),
                listener: Some(claimed.events),
            });
        assert!(socket(0).exists(), "not removed on the scheduling thread");
        // The thread's next work removes it.
        preparer.queue(1, layout(1), None);
        preparer.flush();
        while socket(0).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the next work removed nothing"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            open_logs(&log_fds),
            0,
            "the logs were closed with the socket"
        );
        // With no more work, the end of the run does.
        let late = sockets.join("late.sock");
        std::fs::write(&late, "").unwrap();
        discards
            .lock()
            .unwrap()
            .push(crate::process::discard::Discarded::Socket {
                path: late.clone(),
                listener: None,
            });
        drop(preparer);
        assert!(!late.exists(), "removed when the run ends");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_opened_ahead_are_capped_and_released_stages_give_their_socket_back() {
        let n = OPEN_AHEAD_MAX + 4;
        let (dir, run_dir, plan) = stages("prepare-cap", n);
        let layout = |i: usize| layout(&plan, &run_dir, i);
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).unwrap();
        let socket = |i: usize| crate::attempt::prepare::socket_path(&sockets, i, 1);
        let runtime = runtime();
        let preparer = Preparer::start(n, runtime.handle().clone()).unwrap();
        let mut opened = 0;
        for i in 0..n {
            if preparer.may_open() {
                preparer.queue(i, layout(i), Some(socket(i)));
                opened += 1;
            } else {
                preparer.queue(i, layout(i), None);
            }
        }
        preparer.flush();
        assert_eq!(
            opened, OPEN_AHEAD_MAX,
            "no more than the cap are opened ahead"
        );
        assert!(!preparer.may_open());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !socket(OPEN_AHEAD_MAX - 1).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the preparer opened nothing"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A claimed stage makes room for another.
        match preparer.claim(0) {
            Some(Written {
                files: Some(files), ..
            }) => std::fs::remove_file(files.socket).unwrap(),
            other => panic!("stage 0 was opened ahead: {other:?}"),
        }
        assert!(preparer.may_open());
        // A stage that will not start: its socket goes, and so does its place.
        preparer.release(1);
        assert!(!socket(1).exists(), "a released stage's socket is removed");
        assert!(preparer.claim(1).is_none(), "released means taken");
        // A stage only written has no socket to give back.
        preparer.release(n - 1);
        assert!(!socket(n - 1).exists());
        for i in 2..OPEN_AHEAD_MAX {
            preparer.release(i);
        }
        assert!(preparer.may_open());
        assert!(
            std::fs::read_dir(&sockets).unwrap().next().is_none(),
            "every socket bound ahead was removed"
        );
        drop(preparer);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Work done ahead of the scheduler: the files of the stages about to start, written (and for
//! the very next ones opened) by the preparer thread while earlier stages run, and each
//! attempt's plan made from them.

use super::scheduler::Scheduler;
use super::setup::Setup;
use crate::attempt::handover::{Kind, Successor};
use crate::attempt::launch::AttemptPlan;
use crate::attempt::outcome::Failure;
use crate::attempt::prepare::{prepare_attempt, socket_path, AttemptContext, Layout};
use crate::attempt::preparer::{Preparer, Written};
use crate::error::{Context, Result};
use crate::gpu::GpuInfo;
use crate::host::sockets::RunSocketDir;
use crate::host::Host;

/// The preparer gets the next ready stages when one of the next `PREPARE_LOW + 1` has no
/// files...
const PREPARE_LOW: usize = 2;
/// ...and up to this many of them at a time (each opened one holds three descriptors, which
/// every spawn copies into its child until `execve` closes them).
const PREPARE_BATCH: usize = 8;

/// One attempt to plan: attempt `attempt` of stage `stage` on `gpus`; `cpu_threads`, a built-in
/// CPU stage's share of the cores; `prepared`, what was made ahead for it (whether its output
/// directory was new then, the port held for it).
pub(super) struct Request<'g> {
    pub(super) stage: usize,
    pub(super) attempt: u32,
    pub(super) gpus: &'g [GpuInfo],
    pub(super) cpu_threads: Option<usize>,
    pub(super) prepared: Option<crate::attempt::prepare::Prepared>,
    /// Upstream stages still persisting their outputs (an early start).
    pub(super) being_written: &'g [usize],
}

/// The preparer of one run and the directory of its event sockets.
pub(super) struct Lookahead {
    // Declared before the sockets' directory: it removes the sockets it holds first.
    preparer: Preparer,
    /// This run's event sockets, apart from other runs' of the same host (removed when the
    /// run ends).
    sockets: RunSocketDir,
}

impl Lookahead {
    /// The run's socket directory and preparer thread.
    pub(super) fn start(setup: &Setup, host: &Host) -> Result<Lookahead> {
        let sockets = host
            .sockets
            .for_run(setup.ticket.number)
            .context("cannot create the directory of the run's event sockets")?;
        let stages = setup.plan.plan.stages.len();
        let preparer = Preparer::start(stages, tokio::runtime::Handle::current())
            .context("cannot start the stage-files thread")?;
        Ok(Lookahead { preparer, sockets })
    }

    /// The files written ahead for stage `i`, if any: whether they are fresh, and those opened.
    pub(super) fn claim(&self, i: usize) -> Option<Written> {
        self.preparer.claim(i)
    }

    /// Files prepared for stage `i` will not be used.
    pub(super) fn release(&self, i: usize) {
        self.preparer.release(i);
    }

    /// The plan of one attempt (see [`Request`]); its inputs are its upstream stages'
    /// outputs as the report's records keep them.
    pub(super) fn prepare_attempt(
        &self,
        setup: &Setup,
        request: Request<'_>,
    ) -> std::result::Result<AttemptPlan, Failure> {
        let records = setup.report.read();
        let context = AttemptContext {
            plan: &setup.plan,
            run_dir: &setup.run_dir,
            outputs: &*records,
            worker: setup.worker.as_deref(),
            machine_has_gpus: !setup.cleared.gpus.is_empty(),
            socket_dir: self.sockets.path(),
        };
        let Request {
            stage,
            attempt,
            gpus,
            cpu_threads,
            prepared,
            being_written,
        } = request;
        prepare_attempt(
            &context,
            stage,
            attempt,
            gpus,
            cpu_threads,
            prepared,
            being_written,
        )
    }

    /// The successor of stage `after` chosen by the scheduler, planned from the files the
    /// preparer wrote for it; none if they are not written yet or it cannot be planned (its
    /// own start, the ordinary way, then reports why).
    pub(super) fn successor(
        &self,
        setup: &Setup,
        after: usize,
        j: usize,
        kind: Kind,
    ) -> Option<Successor> {
        let srun = setup.placement.runs_srun_layout(&setup.plan.plan.stages[j]);
        if srun || !self.preparer.written(j) {
            return None;
        }
        let written = self.preparer.claim(j);
        let request = Request {
            stage: j,
            attempt: 1,
            gpus: &[],
            cpu_threads: None,
            prepared: written.as_ref().map(Written::prepared),
            being_written: &[],
        };
        let planned = self.prepare_attempt(setup, request);
        let files = written.and_then(|w| w.files);
        match planned {
            Ok(p) => Some(Successor::new(after, j, kind, p, files)),
            Err(_) => {
                if let Some(files) = files {
                    files.give_back();
                }
                None
            }
        }
    }

    /// Whether stage `j` is one whose first attempt's files the preparer should write.
    fn wants_files(&self, sched: &Scheduler<'_>, j: usize) -> bool {
        sched.states()[j].attempts == 0 && sched.on_cpu(j) && self.preparer.untouched(j)
    }

    /// Queues stage `j`'s first attempt's files; `open`: it is about to start (one of the
    /// next ready ones), so its logs are opened and its socket bound too, not only written.
    fn prepare_ahead(&self, setup: &Setup, sched: &Scheduler<'_>, j: usize, open: bool) {
        if !self.wants_files(sched, j) {
            return;
        }
        let (plan, run_dir) = (&setup.plan, &setup.run_dir);
        let inputs = Layout::inputs_of(plan, j, run_dir);
        let layout = Layout::new(plan, j, run_dir, 1, protocol::worker::Device::Cpu, inputs);
        let socket = open.then(|| socket_path(self.sockets.path(), j, 1));
        self.preparer.queue(j, layout, socket);
    }

    /// Stage `i` just started: the stages that wait only on it are prepared while it runs,
    /// opened too while few are (a chain's next stage then starts without opening anything),
    /// if they will be among the next to start (not behind a long queue of ready stages: their
    /// files would wait unopened). Down a chain of single stages, the next `PREPARE_BATCH` are
    /// handed over at once when the first has no files yet (one wake-up of the preparer per
    /// batch).
    pub(super) fn prepare_downstream(&self, setup: &Setup, sched: &Scheduler<'_>, i: usize) {
        let downstream = &setup.plan.downstream;
        let soon = |d: usize| sched.ready_before(d, PREPARE_BATCH) < PREPARE_BATCH;
        for &d in &downstream[i] {
            if !sched.waits_on_one(d) || !soon(d) {
                continue;
            }
            let batch = self.wants_files(sched, d);
            self.prepare_ahead(setup, sched, d, self.preparer.may_open());
            let mut at = d;
            for _ in 1..PREPARE_BATCH {
                if !batch {
                    break;
                }
                // The one stage after `at` that waits on nothing else.
                let next = match downstream[at].as_slice() {
                    &[n] if sched.waits_on_one(n) && soon(n) => n,
                    _ => break,
                };
                self.prepare_ahead(setup, sched, next, self.preparer.may_open());
                at = next;
            }
        }
    }

    /// The next ready stages' files go to the preparer in batches, once one of the next
    /// `PREPARE_LOW + 1` has none: one wake-up of its thread per batch, not one per stage (on
    /// a small machine each wake-up took time from the stage just started). Then everything
    /// queued goes to its thread in one message.
    pub(super) fn prepare_ready(&self, setup: &Setup, sched: &Scheduler<'_>) {
        let short = sched
            .ready()
            .take(PREPARE_LOW + 1)
            .any(|j| self.wants_files(sched, j));
        if sched.stopping().is_none() && short {
            for j in sched.ready().take(PREPARE_BATCH) {
                self.prepare_ahead(setup, sched, j, true);
            }
        }
        self.preparer.flush();
    }
}

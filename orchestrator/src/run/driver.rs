//! The run loop: turns what happens (a stage's news, a cancel, GPUs coming free, a retry
//! falling due) into [`Event`]s for the [`Scheduler`], and carries out what it decides —
//! starting attempts, supervising them on tasks of their own, emitting each action as the
//! run's events (`crate::events`: the console, the journal and the daemon's feed read them)
//! and rewriting the report. It decides nothing itself.
//!
//! A stage on the CPU gives its slot back (`Freed`) as soon as its main process exited with 0
//! and nothing of its tree is left (see [`supervise::supervise`]), before its outputs are verified
//! and its end recorded: the next stage starts while that bookkeeping runs. Its result
//! (`Done`) comes after, on the same channel, and its downstream stages wait for that.
//!
//! A stage on GPUs whose release held (`Released`: its processes hold none of its GPUs' memory
//! any more; see `crate::gpu::release`) gives its GPUs back then, while it still holds its
//! slot: a stage waiting for them starts while this one persists its outputs.

use super::lookahead::{Lookahead, Request};
use super::scheduler::{Action, Event, Resources, Rules, Scheduler, Start, Stopping};
use super::setup::Setup;
use super::state::StageState;
use super::{ending, RunSummary, StopSignal};
use crate::attempt::handover::{self, NextUp, Started};
use crate::attempt::launch::{self, CancelLevel, Launched, Services};
use crate::attempt::outcome::{AttemptResult, Failure};
use crate::attempt::supervise;
use crate::error::{Context, Result};
use crate::events::{AttemptFacts, RunEvent, StageEnd};
use crate::gpu::{self, GpuInfo};
use crate::host::{Host, Ticket};
use crate::plan::LoadedPlan;
use crate::report::Snapshot;
use crate::timefmt::human_duration;
use protocol::daemon::RunEventKind;
use protocol::status::{FailureClass, RunStatus, StageStatus};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

/// What a running stage tells the run.
pub(super) enum StageNews {
    /// Stage `i` gave its slot back early (its tree is gone; its result follows).
    Freed(usize),
    /// Stage `i` gave its slot to its planned successor, which it started (see
    /// `crate::attempt::handover`; its result follows).
    HandedOver(usize, Started),
    /// A stage released its GPUs and the release held; its result follows.
    Released {
        /// The stage.
        stage: usize,
        /// The GPUs it released.
        gpus: Vec<GpuInfo>,
        /// Whether its downstream stages may start early (its outputs are written manifest
        /// last).
        downstream_may_start: bool,
    },
    /// Stage `i`'s attempt ended: its result, the GPUs it held, and the successor it started
    /// when it succeeded ([`handover::Kind::Chain`]).
    Done(usize, Box<AttemptResult>, Vec<GpuInfo>, Option<Started>),
}

/// The run loop's I/O: everything it writes to and starts with, and the handles of running
/// and handed-over attempts by stage (which stage is in which state of a hand-over or an early
/// start is the [`Scheduler`]'s to know).
struct Driver<'h> {
    setup: Setup,
    host: &'h Rc<Host>,
    /// The cancel level passed on to every running stage.
    cancel_tx: watch::Sender<CancelLevel>,
    news_tx: mpsc::UnboundedSender<StageNews>,
    /// The successor's prepared attempt, shared with the task of the stage it follows, which
    /// starts it (see `handover`; which stage it is, the scheduler knows).
    next_up: NextUp,
    /// The attempts that ending stages started in their place, until recorded
    /// ([`Start::HandedOver`]).
    handed: BTreeMap<usize, std::result::Result<Box<Launched>, Failure>>,
    /// What stops each running early-started stage alone ([`Action::StopStage`]).
    stoppers: BTreeMap<usize, tokio::sync::oneshot::Sender<()>>,
    lookahead: Lookahead,
    started: Instant,
    started_unix: f64,
    spans: Vec<gpu::timeline::StageSpan>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    run_files: super::files::RunFiles,
    last_report: Instant,
    report_every: Duration,
}

/// Runs the stages of a run set up as `setup`, from `states`, to the run's end.
pub(super) async fn drive(
    setup: Setup,
    states: Vec<StageState>,
    host: &Rc<Host>,
    mut cancel: watch::Receiver<CancelLevel>,
    stop_signal: StopSignal,
) -> Result<RunSummary> {
    let plan = setup.plan.clone();
    let settings = &plan.plan.run;
    let rules = Rules {
        max_parallel: setup
            .placement
            .max_parallel(settings.max_parallel.map(|n| n as usize)),
        fail_fast: settings.fail_fast,
        on_leak: settings.on_leak,
        machine_has_gpus: !setup.cleared.gpus.is_empty(),
        // Inside Slurm a stage may run on another node: only a local run starts early.
        early_start: setup.placement.allows_early_start() && host.settings.starts_early(),
    };
    let mut sched = Scheduler::new(&plan, rules, states);
    if let Some(bucket) = setup.placement.start_pacing() {
        sched.pace_starts(bucket);
    }
    let (news_tx, mut news_rx) = mpsc::unbounded_channel::<StageNews>();
    let mut driver = Driver::start(setup, host, news_tx)?;
    // A cancel that came before the run started applies at once.
    let early = *cancel.borrow_and_update();
    let actions = sched.on(Event::Cancel(early), Instant::now());
    driver.carry_out(&mut sched, actions, None)?;
    let mut cancel_closed = false;
    loop {
        driver.round(&mut sched)?;
        if sched.is_done() {
            break;
        }
        let gpu_waiting = sched.gpu_waiting();
        let far = Instant::now() + Duration::from_secs(86_400);
        let next_retry = sched.next_wake();
        let retry_at = tokio::time::Instant::from_std(next_retry.unwrap_or(far));
        let services = driver.setup.services.clone();
        tokio::select! {
            Some(news) = news_rx.recv() => driver.on_news(&mut sched, news)?,
            changed = cancel.changed(), if !cancel_closed => match changed {
                Err(_) => cancel_closed = true, // nobody can cancel any more
                Ok(()) => {
                    let level = *cancel.borrow_and_update();
                    let actions = sched.on(Event::Cancel(level), Instant::now());
                    driver.carry_out(&mut sched, actions, None)?;
                }
            },
            _ = host.gpus_freed.notified(), if gpu_waiting => {}
            // A stage's start waits in the journal for the next record; a long stage's is
            // written at the next tick of the run's sampling clock.
            _ = services.tree_sampling.next(), if driver.setup.journal.has_pending() => {
                driver.setup.journal.flush_pending().context("cannot write the journal")?;
            }
            // A GPU held by a process that is not ours frees without telling anyone.
            _ = tokio::time::sleep(Duration::from_millis(500)), if gpu_waiting => {}
            _ = tokio::time::sleep_until(retry_at), if next_retry.is_some() => {}
        }
    }
    if !cancel_closed {
        ending::wait_for_late_stop(&driver.setup, &mut sched, &mut cancel).await;
    }
    driver.finish(sched, stop_signal).await
}

/// The host's GPUs and cores as one run's scheduler sees them.
struct HostResources<'a> {
    host: &'a Host,
    ticket: Ticket,
    run_id: &'a str,
    plan: &'a LoadedPlan,
    tolerance_bytes: u64,
}

impl Resources for HostResources<'_> {
    fn usable_gpus(&self) -> usize {
        self.host.usable_gpus()
    }
    fn total_gpus(&self) -> usize {
        self.host.gpus().len()
    }
    fn take_gpus(
        &mut self,
        stage: usize,
        n: usize,
        avoid: &[String],
    ) -> std::result::Result<Vec<GpuInfo>, String> {
        let stage = &self.plan.plan.stages[stage];
        let owner = crate::host::gpu_owner(self.run_id, &stage.name);
        let share = stage.gpu_memory.map(|b| b.0);
        self.host
            .take_gpus(n, share, self.ticket, &owner, self.tolerance_bytes, avoid)
            .map_err(|wait| wait.to_string())
    }
    fn cpu_builtins_running(&self) -> usize {
        self.host.cpu_builtin_running.get()
    }
    fn cpus(&self) -> usize {
        self.host.cpus
    }
}

impl<'h> Driver<'h> {
    /// The loop's I/O, started: the GPU sampler, the run's files, the preparer.
    fn start(
        setup: Setup,
        host: &'h Rc<Host>,
        news_tx: mpsc::UnboundedSender<StageNews>,
    ) -> Result<Driver<'h>> {
        let started = Instant::now();
        let run_dir = &setup.run_dir;
        let timeline_csv = run_dir.root().join("gpu-timeline.csv");
        let sampler = match &setup.services.probe {
            Some(probe) if !setup.cleared.gpus.is_empty() => Some(
                gpu::timeline::start_sampler(
                    probe.clone(),
                    setup.cleared.gpus.clone(),
                    timeline_csv,
                    started,
                    Duration::from_millis(50),
                )
                .context("cannot write gpu-timeline.csv")?,
            ),
            _ => None,
        };
        // A report exists from the start, so `orchestrate report` has something to show even
        // if this process is killed before the first stage ends: with `plan.resolved.json`,
        // written while the first stages run (a resumed run's, with the stages it keeps, here).
        let run_files = super::files::RunFiles::start(
            setup.plan.clone(),
            run_dir.clone(),
            setup.cleared.gpu_check.clone(),
            started,
            (!setup.resume).then(|| setup.placement.clone()),
        )
        .context("cannot start the thread writing the run's files")?;
        if setup.resume {
            Snapshot::new(
                &setup.plan,
                &*setup.report.read(),
                run_dir,
                &setup.cleared.gpu_check,
                started,
                RunStatus::Running,
                &setup.placement,
            )
            .write_or_warn(&run_dir.report_path(), &setup.events);
        }
        let lookahead = Lookahead::start(&setup, host)?;
        Ok(Driver {
            host,
            cancel_tx: watch::channel(CancelLevel::None).0,
            news_tx,
            next_up: NextUp::default(),
            handed: BTreeMap::new(),
            stoppers: BTreeMap::new(),
            lookahead,
            started,
            started_unix: crate::timefmt::unix_secs_f64(),
            spans: Vec::new(),
            sampler,
            run_files,
            last_report: Instant::now(),
            report_every: Duration::from_secs(1),
            setup,
        })
    }

    fn resources(&self) -> HostResources<'_> {
        HostResources {
            host: self.host,
            ticket: self.setup.ticket,
            run_id: &self.setup.run_id,
            plan: &self.setup.plan,
            tolerance_bytes: self.setup.services.tolerance_bytes,
        }
    }

    /// One round: starts what the scheduler chooses, plans the hand-over, hands the next
    /// stages' files to the preparer.
    fn round(&mut self, sched: &mut Scheduler<'_>) -> Result<()> {
        sched.begin_round(Instant::now());
        loop {
            let mut actions = Vec::new();
            let next = {
                let mut resources = self.resources();
                sched.next_start(&mut resources, &mut actions)
            };
            self.carry_out(sched, actions, None)?;
            match next {
                None => break,
                Some(Start::HandedOver(j)) => {
                    let started = self.handed.remove(&j).ok_or_else(|| {
                        crate::error::Error::Internal(format!("no hand-over for stage {j}"))
                    })?;
                    self.record_start(sched, j, Vec::new(), started)?;
                }
                Some(Start::Fresh {
                    stage,
                    attempt,
                    gpus,
                    cpu_threads,
                    being_written,
                }) => {
                    let start = Fresh {
                        attempt,
                        gpus,
                        cpu_threads,
                        being_written,
                    };
                    self.launch(sched, stage, start)?
                }
            }
        }
        if let Some((after, j, kind)) = sched.handover_candidate() {
            let successor = self.lookahead.successor(&self.setup, after, j, kind);
            if let Some(successor) = successor {
                self.next_up.plan(successor);
                sched.successor_planned(after, j, kind);
            }
        }
        self.lookahead.prepare_ready(&self.setup, sched);
        if !sched.gpu_waiting() {
            self.host.stop_waiting(self.setup.ticket);
        }
        Ok(())
    }

    /// Prepares and spawns attempt `start.attempt` of stage `i`.
    fn launch(&mut self, sched: &mut Scheduler<'_>, i: usize, start: Fresh) -> Result<()> {
        let Fresh {
            attempt,
            gpus,
            cpu_threads,
            being_written,
        } = start;
        let early = !being_written.is_empty();
        let setup = &self.setup;
        let stage = &setup.plan.plan.stages[i];
        // What an earlier early start of the stage left is not resumed from (see `early`);
        // only built-in stages start early, so a command stage costs no look for the mark.
        let cleared = match stage.kind {
            Some(_) => super::early::before_start(&setup.run_dir, &stage.name, early),
            None => Ok(()),
        }
        .map_err(|e| Failure::SpawnFailed(format!("cannot clear what an early start left: {e}")));
        // The preparer's files serve a first attempt on the CPU only, and not an early start
        // (whose spec names the inputs being written).
        let written = match early {
            true => {
                self.lookahead.release(i);
                None
            }
            false => self
                .lookahead
                .claim(i)
                .filter(|_| attempt == 1 && gpus.is_empty()),
        };
        let request = Request {
            stage: i,
            attempt,
            gpus: &gpus,
            cpu_threads,
            prepared: written.as_ref().map(|w| w.prepared()),
            being_written: &being_written,
        };
        let prepared = cleared.and_then(|()| self.lookahead.prepare_attempt(setup, request));
        let attempt_plan = match prepared {
            Ok(p) => setup.placement.place(p, stage),
            Err(failure) => {
                self.give_back_gpus(i, &gpus);
                let event = Event::StartFailed {
                    stage: i,
                    class: failure.class(),
                    message: failure.describe(),
                };
                let actions = sched.on(event, Instant::now());
                return self.carry_out(sched, actions, None);
            }
        };
        if cpu_threads.is_some() {
            let running = &self.host.cpu_builtin_running;
            running.set(running.get() + 1);
        }
        let span = stage_span(&stage.name, attempt);
        let started = span.in_scope(|| {
            launch::start_attempt(attempt_plan, written.and_then(|w| w.files), &setup.services)
        });
        if early {
            let ahead: Vec<&str> = being_written
                .iter()
                .map(|&u| setup.plan.plan.stages[u].name.as_str())
                .collect();
            setup.events.note(&format!(
                "{}: started early, while {} still writes its outputs",
                stage.name,
                ahead.join(", ")
            ));
        }
        self.record_start(sched, i, gpus, started)
    }

    /// Records stage `i`'s start (its event) and supervises it on a task of its own;
    /// an attempt that could not spawn ends at once.
    fn record_start(
        &mut self,
        sched: &mut Scheduler<'_>,
        i: usize,
        given: Vec<GpuInfo>,
        started: std::result::Result<Box<Launched>, Failure>,
    ) -> Result<()> {
        let launched = match started {
            Ok(launched) => launched,
            Err(failure) => {
                let event = Event::Launched {
                    stage: i,
                    may_hand_over: false,
                };
                sched.on(event, Instant::now());
                let failed = Box::new(AttemptResult::early_failure(failure));
                let _ = self.news_tx.send(StageNews::Done(i, failed, given, None));
                return Ok(());
            }
        };
        let setup = &mut self.setup;
        let stage = &setup.plan.plan.stages[i];
        let attempt = sched.states()[i].attempts;
        let span = stage_span(&stage.name, attempt);
        let event = RunEvent::StageStarted {
            stage: stage.name.clone(),
            attempt,
            pid: launched.pid(),
            placement: launched.placement(),
            gpus: given.iter().map(|g| g.uuid.clone()).collect(),
            plan_hash: setup.fingerprints.get(i),
        };
        span.in_scope(|| setup.events.emit(event))?;
        let after = setup
            .placement
            .after_attempt(stage, &setup.run_dir.stage_dir(&stage.name));
        let on_this_node = setup.placement.on_this_node(&after);
        // A GPU or srun stage's verdicts come after its tree is gone: it neither frees its
        // slot early nor hands over to a successor.
        // A placed step's successor is placed as a step of its own, never handed over.
        // Nor an early start: its success is not its own to act on before its upstream's.
        let may_hand_over = given.is_empty() && on_this_node && !sched.started_early(i);
        sched.on(
            Event::Launched {
                stage: i,
                may_hand_over,
            },
            Instant::now(),
        );
        // A stage's GPUs go on at its release only where this machine's NVML sees them.
        let mut task = self.supervisor(i, may_hand_over, on_this_node.then_some(&given[..]));
        if sched.started_early(i) {
            let (cancel, stopper) = super::early::stoppable(self.cancel_tx.subscribe());
            task.cancel = cancel;
            self.stoppers.insert(i, stopper);
        }
        let services = self.setup.services.clone();
        tokio::task::spawn_local(
            async move {
                // Boxed: supervising is a future of kilobytes, which would otherwise be copied
                // whole as the task is made and placed, at every stage.
                let (result, chained) = Box::pin(task.supervise(launched, &services)).await;
                // srun stages: the GPU check of every node of the stage.
                after.run(&result, &services.reaper).await;
                let news = StageNews::Done(i, Box::new(result), given, chained);
                let _ = task.news_tx.send(news);
            }
            .instrument(span),
        );
        // Once it runs: the stages that wait only on it are prepared while it does.
        self.lookahead.prepare_downstream(&self.setup, sched, i);
        Ok(())
    }

    /// The supervising task of stage `i`'s attempt.
    /// `release_gpus`: the GPUs it may give back at a release, if it may.
    fn supervisor(
        &self,
        i: usize,
        may_hand_over: bool,
        release_gpus: Option<&[GpuInfo]>,
    ) -> SupervisorTask {
        let mut cancel = self.cancel_tx.subscribe();
        // A stage handed over as a stop was asked for learns of it at once.
        if *cancel.borrow() != CancelLevel::None {
            cancel.mark_changed();
        }
        let hand_off = may_hand_over.then(|| handover::HandOff {
            after: i,
            next_up: self.next_up.clone(),
            cancel: cancel.clone(),
            services: self.setup.services.clone(),
        });
        SupervisorTask {
            stage: i,
            cancel,
            hand_off,
            // Not with fail_fast (a failure must stop what starts next).
            frees_early: !self.setup.plan.plan.run.fail_fast,
            release_gpus: release_gpus.map(<[GpuInfo]>::to_vec),
            news_tx: self.news_tx.clone(),
        }
    }

    /// A stage's news: the scheduler's view updated, its consequences carried out.
    fn on_news(&mut self, sched: &mut Scheduler<'_>, news: StageNews) -> Result<()> {
        let now = Instant::now();
        let (i, result, given, chained) = match news {
            StageNews::Freed(i) => {
                sched.on(Event::SlotFreed(i), now);
                return Ok(());
            }
            StageNews::HandedOver(
                from,
                Started {
                    stage: to,
                    launched,
                },
            ) => {
                self.handed.insert(to, launched);
                sched.on(Event::HandedOver { from, to }, now);
                return Ok(());
            }
            StageNews::Released {
                stage: i,
                gpus,
                downstream_may_start,
            } => {
                let event = Event::GpusReleased {
                    stage: i,
                    downstream_may_start,
                };
                let actions = sched.on(event, now);
                // The scheduler says whether they go back now (once, while the stage runs).
                if actions.contains(&Action::GiveBackGpus(i)) {
                    self.give_back_gpus(i, &gpus);
                }
                return self.carry_out(sched, actions, None);
            }
            StageNews::Done(i, mut result, given, chained) => {
                self.stoppers.remove(&i);
                result.started_early = sched.started_early(i);
                if matches!(result.outcome, crate::attempt::outcome::Outcome::Failed(_)) {
                    // A placed step lost with its node (`retry_on = ["lost"]`).
                    let dir = self
                        .setup
                        .run_dir
                        .stage_dir(&self.setup.plan.plan.stages[i].name);
                    result.lost_on = self.setup.placement.lost_on(&dir, sched.attempts(i));
                }
                (i, result, given, chained)
            }
        };
        let chained = chained.map(|started| {
            self.handed.insert(started.stage, started.launched);
            started.stage
        });
        if self.setup.plan.plan.stages[i].kind.is_some() && given.is_empty() {
            let running = &self.host.cpu_builtin_running;
            running.set(running.get().saturating_sub(1));
        }
        // A stage that released its GPUs gave them back then (another stage may hold them now).
        if sched.holds_gpus(i) {
            self.give_back_gpus(i, &given);
        }
        self.note_spans(i, &result);
        let event = Event::AttemptEnded {
            stage: i,
            result: &result,
            chained,
        };
        let actions = sched.on(event, now);
        self.carry_out(sched, actions, Some(&result))?;
        sched.keep_result(i, result);
        self.check_early_inits(sched)?;
        self.rewrite_report()
    }

    /// After an attempt's end: an early-started stage still waiting for its `init` stage's
    /// checkpoint is stopped if that stage has succeeded without writing one (a command stage
    /// that opted in and broke its promise; the built-in train stage always writes its
    /// manifest).
    fn check_early_inits(&mut self, sched: &mut Scheduler<'_>) -> Result<()> {
        for (d, u) in sched.take_inits_succeeded() {
            let name = &self.setup.plan.plan.stages[u].name;
            let manifest = self
                .setup
                .run_dir
                .output_dir(name)
                .join(protocol::checkpoint::MANIFEST_FILE);
            if !manifest.is_file() {
                let event = Event::InputMissing {
                    stage: d,
                    upstream: u,
                };
                let actions = sched.on(event, Instant::now());
                self.carry_out(sched, actions, None)?;
            }
        }
        Ok(())
    }

    /// The GPU spans of an attempt, for the run's memory picture.
    fn note_spans(&mut self, i: usize, result: &AttemptResult) {
        let Some(t) = result.timing else { return };
        let name = &self.setup.plan.plan.stages[i].name;
        for g in &result.gpu {
            self.spans.push(gpu::timeline::StageSpan {
                stage: name.clone(),
                uuid: g.uuid.clone(),
                start_s: t.spawned - self.started_unix,
                // A stage whose release held gave the GPU to the next one then.
                end_s: t.released.unwrap_or(t.verified) - self.started_unix,
                baseline_bytes: g.baseline_bytes,
                clean: g.verdict != protocol::report::GpuVerdict::Leaked,
            });
        }
    }

    /// Rewrites `report.json`. The whole report costs O(stages): at most once a second, and
    /// never more than 0.2% of the time (a 100,000-stage sweep's report is tens of megabytes;
    /// every rewrite is time the next stage waits, so its share is a cost per stage that grows
    /// with the plan; the measurements behind 0.2%: `bench/overhead/README.md`, the tenth
    /// round).
    fn rewrite_report(&mut self) -> Result<()> {
        // The first report is still being written (at a lower CPU priority, see
        // `super::files`): this rewrite waits for the next round rather than the run.
        if self.last_report.elapsed() < self.report_every || !self.run_files.done() {
            return Ok(());
        }
        let setup = &self.setup;
        self.run_files.finish(&setup.events)?;
        let t = Instant::now();
        Snapshot::new(
            &setup.plan,
            &*setup.report.read(),
            &setup.run_dir,
            &setup.cleared.gpu_check,
            self.started,
            RunStatus::Running,
            &setup.placement,
        )
        .write_or_warn(&setup.run_dir.report_path(), &setup.events);
        self.report_every = (t.elapsed() * 500).max(Duration::from_secs(1));
        self.last_report = Instant::now();
        Ok(())
    }

    /// Carries out the scheduler's actions, in order; `result`: the attempt whose end they
    /// follow from, if one did. An end the scheduler held and concluded now is recorded with
    /// its own attempt's result.
    fn carry_out(
        &mut self,
        sched: &mut Scheduler<'_>,
        actions: Vec<Action>,
        result: Option<&AttemptResult>,
    ) -> Result<()> {
        let concluded = sched.take_concluded();
        for action in actions {
            let held = match &action {
                Action::Finished { stage, .. } => concluded
                    .iter()
                    .find(|(d, _)| d == stage)
                    .map(|(_, r)| &**r),
                _ => None,
            };
            self.carry_out_one(action, held.or(result))?;
        }
        Ok(())
    }

    /// Carries out one action: an end or skip recorded as its event, a GPU quarantined, a
    /// cancel passed on, files or GPUs given back, an early start stopped.
    fn carry_out_one(&mut self, action: Action, result: Option<&AttemptResult>) -> Result<()> {
        let setup = &self.setup;
        let events = &setup.events;
        let name = |i: usize| setup.plan.plan.stages[i].name.clone();
        match action {
            Action::Finished {
                stage,
                attempt,
                status,
                error,
                failure,
                retry_in,
                runs_again,
            } => {
                let ended = Ended {
                    stage,
                    attempt,
                    status,
                    error,
                    failure,
                    retry_in,
                    runs_again,
                };
                self.record_end(ended, result)?;
            }
            Action::Skipped {
                stage,
                class,
                reason,
            } => events.emit(RunEvent::StageSkipped {
                stage: name(stage),
                class,
                reason,
            })?,
            Action::Waiting { stage, why } => events.emit(RunEvent::StageWaiting {
                stage: name(stage),
                reason: why,
            })?,
            Action::Quarantine(uuid) => {
                self.host.quarantine(&uuid);
                events.report(RunEventKind::GpuQuarantined { uuid });
            }
            Action::Stop(cause) => events.report(RunEventKind::RunStopping {
                reason: match cause {
                    Stopping::Interrupted => FailureClass::Interrupted,
                    Stopping::FailFast => FailureClass::FailFast,
                    Stopping::GpuLeaked => FailureClass::GpuLeaked,
                },
            }),
            Action::CancelStages(level) => self.cancel_stages(level),
            Action::ReleaseFiles(stage) => self.lookahead.release(stage),
            // Given back as the release that caused it came in (`on_news`).
            Action::GiveBackGpus(_) => {}
            Action::StopStage(stage) => self.stop_early_start(stage),
            // Its success is recorded (after its upstreams'): nothing left to clear.
            Action::ClearEarlyMark(stage) => {
                super::early::finished(&setup.run_dir, &setup.plan.plan.stages[stage].name)
            }
            Action::AbandonSuccessor(stage) => self.next_up.abandon(stage),
        }
        Ok(())
    }

    /// Records an attempt's end as the scheduler concluded it, from its `result` (none when it
    /// never ran): one [`RunEvent::StageFinished`] for every reader, with all that the
    /// report keeps of it.
    fn record_end(&mut self, ended: Ended, result: Option<&AttemptResult>) -> Result<()> {
        let setup = &self.setup;
        let Ended {
            stage,
            attempt,
            status,
            error,
            failure,
            retry_in,
            runs_again,
        } = ended;
        let name = setup.plan.plan.stages[stage].name.clone();
        // A placed step lost on its node: the node, beside srun's own words.
        let lost_on = (status == StageStatus::Failed)
            .then(|| setup.run_dir.stage_dir(&name))
            .and_then(|dir| setup.placement.lost_on(&dir, attempt));
        let end = StageEnd {
            stage: name,
            attempt,
            status,
            error,
            failure,
            runs_again,
            lost_on,
            retry_in,
            wall: result.map(|r| r.wall),
            plan_hash: setup.fingerprints.get(stage),
            checkpoints: result.map(|r| r.checkpoints.clone()).unwrap_or_default(),
            metrics: result.map(|r| r.metrics.clone()).unwrap_or_default(),
            stderr_tail: result.and_then(|r| r.stderr_tail.clone()),
            facts: result.map(|r| Box::new(facts_of(r))),
        };
        setup.events.emit(RunEvent::StageFinished(Box::new(end)))?;
        Ok(())
    }

    /// Passes a cancel on to every running stage, saying what it does.
    fn cancel_stages(&mut self, level: CancelLevel) {
        let events = &self.setup.events;
        match level {
            CancelLevel::Kill => events.warn("killing running stages now"),
            _ => events.warn(&format!(
                "stopping: running stages get SIGTERM and {} to exit; signal again to kill them now",
                human_duration(self.setup.plan.plan.run.grace.get())
            )),
        }
        let _ = self.cancel_tx.send(level);
    }

    /// Gives stage `i`'s GPUs (whole, or its share) back to the host.
    fn give_back_gpus(&self, i: usize, gpus: &[GpuInfo]) {
        // A CPU stage holds none: nothing to name an owner for (at every stage of a sweep).
        if gpus.is_empty() {
            return;
        }
        let name = &self.setup.plan.plan.stages[i].name;
        let owner = crate::host::gpu_owner(&self.setup.run_id, name);
        self.host.give_back_gpus(gpus, &owner);
    }

    /// Stops an early-started stage that cannot use its upstream's outputs.
    fn stop_early_start(&mut self, stage: usize) {
        self.setup.events.warn(&format!(
            "{}: stopping it (it started early and cannot use its upstream stage's outputs; it will run again)",
            self.setup.plan.plan.stages[stage].name
        ));
        if let Some(stop) = self.stoppers.remove(&stage) {
            let _ = stop.send(());
        }
    }

    /// Ends the run: the stages that did not start skipped, its status (inside Slurm, after
    /// asking Slurm why the job stopped), the journal's last record, `report.json`, the
    /// results and the GPU memory picture.
    async fn finish(
        mut self,
        mut sched: Scheduler<'_>,
        stop_signal: StopSignal,
    ) -> Result<RunSummary> {
        let (skipped, verdict) = sched.finish();
        self.carry_out(&mut sched, skipped, None)?;
        let (status, exit_code) =
            ending::status_of(verdict, &mut self.setup, stop_signal.first()).await;
        let setup = &mut self.setup;
        setup
            .events
            .emit(RunEvent::RunVerdict { status, exit_code })?;
        self.host.stop_waiting(setup.ticket);
        self.run_files.finish(&setup.events)?;
        let setup = &self.setup;
        // Every stage's end and skip is in the records now: written from them once, the
        // guard let go before the run waits for the tracker.
        let (summary, tracked) = {
            let records = setup.report.read();
            let report = Snapshot::new(
                &setup.plan,
                &*records,
                &setup.run_dir,
                &setup.cleared.gpu_check,
                self.started,
                status,
                &setup.placement,
            );
            ending::write_report_and_results(setup, &report);
            (report.summary(), ending::to_track(setup, &report))
        };
        if let Some(tracked) = tracked {
            ending::track(setup, tracked).await;
        }
        if let Some(sampler) = self.sampler.take() {
            sampler.abort();
            ending::draw_gpu_memory(setup, &self.spans, self.started);
        }
        setup
            .events
            .emit(RunEvent::RunFinished { status, exit_code })?;
        Ok(RunSummary {
            exit_code,
            status,
            summary,
        })
    }
}

/// An attempt's end as the scheduler concluded it ([`Action::Finished`]).
struct Ended {
    stage: usize,
    attempt: u32,
    status: StageStatus,
    error: Option<String>,
    failure: Option<FailureClass>,
    retry_in: Option<Duration>,
    runs_again: bool,
}

/// What an attempt that ran left beyond its outputs, metrics and stderr, as its end's event
/// carries it.
fn facts_of(result: &AttemptResult) -> AttemptFacts {
    use crate::process::reaper::ExitStatus;
    AttemptFacts {
        exit_code: match result.exit {
            Some(ExitStatus::Code(c)) => Some(c),
            _ => None,
        },
        signal: match result.exit {
            Some(ExitStatus::Signal(s)) => Some(crate::process::tree::signal_name(s)),
            _ => None,
        },
        gpu: result.gpu.clone(),
        leftover_processes: (result.leftovers.iter())
            .map(|p| format!("pid {} ({})", p.pid, p.name))
            .collect(),
        protocol_violations: result.violations.clone(),
        timing: result.timing,
        host: result.host,
        start: result.start.clone(),
        started_early: result.started_early,
    }
}

/// A fresh start as the scheduler chose it ([`Start::Fresh`]), less the stage.
struct Fresh {
    attempt: u32,
    gpus: Vec<GpuInfo>,
    cpu_threads: Option<usize>,
    being_written: Vec<usize>,
}

/// The tracing span of one attempt.
fn stage_span(name: &str, attempt: u32) -> tracing::Span {
    tracing::info_span!(target: "orchestrate::stage", "stage", stage = %name, attempt)
}

/// What a stage's supervising task holds: how it learns of a cancel, whom it may hand its
/// slot to, and where it sends its news.
struct SupervisorTask {
    stage: usize,
    cancel: watch::Receiver<CancelLevel>,
    hand_off: Option<handover::HandOff>,
    frees_early: bool,
    /// The GPUs the attempt was given, when it may give them back at a release.
    release_gpus: Option<Vec<GpuInfo>>,
    news_tx: mpsc::UnboundedSender<StageNews>,
}

impl SupervisorTask {
    /// Supervises the attempt to its result; the successor it started when it succeeded.
    async fn supervise(
        &self,
        launched: Box<Launched>,
        services: &Services,
    ) -> (AttemptResult, Option<Started>) {
        let mut hooks = Hooks {
            task: self,
            chained: None,
        };
        let result =
            supervise::supervise(launched, services, self.cancel.clone(), &mut hooks).await;
        (result, hooks.chained)
    }
}

/// The run's side of a supervised attempt's hand-over points.
struct Hooks<'a> {
    task: &'a SupervisorTask,
    chained: Option<Started>,
}

impl supervise::AttemptHooks for Hooks<'_> {
    fn tree_gone(&mut self) -> bool {
        let Some(hand_off) = self
            .task
            .hand_off
            .as_ref()
            .filter(|_| self.task.frees_early)
        else {
            return false;
        };
        let i = self.task.stage;
        match hand_off.slot_freed() {
            handover::Slot::HandedOver(started) => {
                let _ = self.task.news_tx.send(StageNews::HandedOver(i, started));
                false
            }
            handover::Slot::NoTaker => false,
            // True: the run loop has a stage to start; the task then waits for it to.
            handover::Slot::Free => {
                let _ = self.task.news_tx.send(StageNews::Freed(i));
                true
            }
        }
    }

    fn succeeded(&mut self) {
        if let Some(hand_off) = &self.task.hand_off {
            self.chained = hand_off.start(handover::Kind::Chain);
        }
    }

    fn gpus_released(&mut self, downstream_may_start: bool) {
        if let Some(gpus) = &self.task.release_gpus {
            let news = StageNews::Released {
                stage: self.task.stage,
                gpus: gpus.clone(),
                downstream_may_start,
            };
            let _ = self.task.news_tx.send(news);
        }
    }

    fn hands_on_at_release(&self) -> bool {
        self.task
            .release_gpus
            .as_ref()
            .is_some_and(|g| !g.is_empty())
    }
}

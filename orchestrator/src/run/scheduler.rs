//! The run's decisions, without I/O: which stage starts next, what an attempt's end means
//! (success, retry after a backoff, failure and the skips it causes), what a leaked GPU means
//! under `on_leak`, and how a cancel or a stop ends the run.
//!
//! [`Scheduler`] holds the state of every stage of one run. The run loop ([`super`]) turns
//! what happens (an attempt ended, a slot came free, a cancel) into [`Event`]s, asks for the
//! next stages to start with [`Scheduler::next_start`], and carries out the [`Action`]s it gets
//! back (journal and console records, quarantines, passing a cancel on). Nothing here touches
//! a process, a file or the clock: time comes in as an argument, GPUs through [`Resources`].
//!
//! Early starts: a running stage whose GPUs went back at its release and whose outputs are
//! written the checkpoint way (manifest last; its `released` event said so) lets the built-in
//! stages waiting only on it (and on stages that succeeded) start at once, provisionally
//! ([`Start::Fresh::being_written`]). Such an attempt's end is held until every upstream it
//! started ahead of has ended: their success concludes it as usual (so its finish is recorded
//! after theirs); a failure voids it — it is stopped if it still runs ([`Action::StopStage`]),
//! recorded as stopped, not counted against its retries, and started again once the upstream's
//! retry succeeds (or skipped with it).
//!
//! Readiness is tracked incrementally, so each event costs O(its neighbours), not O(stages): a
//! 10,000-stage sweep schedules in linear time.

use crate::attempt::handover;
use crate::attempt::launch::CancelLevel;
use crate::attempt::outcome::{AttemptResult, Outcome};
use crate::fasthash::FastSet;
use crate::gpu::GpuInfo;
use crate::plan::LoadedPlan;
use crate::run::state::{StageState, Status};
use protocol::plan::OnLeak;
use protocol::report::GpuVerdict;
use protocol::status::{FailureClass, StageStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

/// The wait before attempt `attempt + 1` of a stage whose attempt `attempt` failed: 0.5 s,
/// doubling per attempt up to the sixth (16 s), then 16 s.
pub(crate) fn retry_backoff(attempt: u32) -> Duration {
    Duration::from_millis(500 << attempt.clamp(1, 6).saturating_sub(1))
}

/// The plan's rules that decide the run, as the scheduler applies them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// Stages holding a slot at once (at least 1).
    pub(crate) max_parallel: usize,
    /// A failure (after retries) stops further starts.
    pub(crate) fail_fast: bool,
    /// What a leaked GPU does.
    pub(crate) on_leak: OnLeak,
    /// Whether stages that ask for GPUs get them (else they run on the CPU).
    pub(crate) machine_has_gpus: bool,
    /// Whether built-in stages may start early, while an upstream that released its GPUs
    /// still persists its outputs (see the module's doc).
    pub(crate) early_start: bool,
}

/// Why a run starts no further stage. Ordered by precedence: the greatest cause is the one
/// the stages left unstarted are skipped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stopping {
    /// A GPU leaked and `on_leak = "fail"`.
    GpuLeaked,
    /// A stage failed and `fail_fast = true`.
    FailFast,
    /// The run was cancelled (a signal, `orchestrate cancel`).
    Interrupted,
}

impl Stopping {
    /// The failure class and reason of a stage skipped because of this stop.
    fn skip_reason(self) -> (FailureClass, &'static str) {
        match self {
            Stopping::Interrupted => (
                FailureClass::Interrupted,
                "not started: the run was interrupted",
            ),
            Stopping::FailFast => (
                FailureClass::FailFast,
                "not started: a stage failed and fail_fast = true",
            ),
            Stopping::GpuLeaked => (
                FailureClass::GpuLeaked,
                "not started: a GPU leaked and on_leak = \"fail\"",
            ),
        }
    }
}

/// What the run loop tells the scheduler.
pub(crate) enum Event<'a> {
    /// Stage `stage`'s attempt started (or failed to spawn; its end follows); `may_hand_over`:
    /// it may free its slot early or start its successor itself ([`handover`]).
    Launched { stage: usize, may_hand_over: bool },
    /// The attempt could not be prepared: no process ran (an input that no longer verifies).
    StartFailed {
        stage: usize,
        class: FailureClass,
        message: String,
    },
    /// Stage `stage` gave its slot back before its result (its tree is gone).
    SlotFreed(usize),
    /// Stage `from` gave its slot to `to`, which it started ([`handover::Kind::Slot`]).
    HandedOver { from: usize, to: usize },
    /// Stage `stage` released its GPUs and the release held (`crate::gpu::release`): they
    /// may go to another stage now; the stage keeps its slot until its result.
    /// `downstream_may_start`: its outputs are written the checkpoint way, so the stages after
    /// it may start early.
    GpusReleased {
        stage: usize,
        downstream_may_start: bool,
    },
    /// Stage `stage`'s attempt ended with `result`; `chained`: the successor it started when it
    /// succeeded ([`handover::Kind::Chain`]).
    AttemptEnded {
        stage: usize,
        result: &'a AttemptResult,
        chained: Option<usize>,
    },
    /// Stage `stage`, started early, reads the checkpoint of `upstream`, which succeeded
    /// without one (no `manifest.json`, which its release promised): the early attempt waits
    /// for nothing that will come, so it is stopped and void, and starts again the ordinary
    /// way (where its worker says what is missing).
    InputMissing { stage: usize, upstream: usize },
    /// The run was asked to stop.
    Cancel(CancelLevel),
}

/// What the scheduler asks the run loop to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Record an attempt's end (console, journal, report); `failure`: the class of its
    /// failure; `retry_in`: it will be retried then; `runs_again`: the stage waits to run again
    /// (a retry, or a void early start).
    Finished {
        stage: usize,
        attempt: u32,
        status: StageStatus,
        error: Option<String>,
        failure: Option<FailureClass>,
        retry_in: Option<Duration>,
        runs_again: bool,
    },
    /// Record that a stage will not run.
    Skipped {
        stage: usize,
        class: FailureClass,
        reason: String,
    },
    /// Tell the user why a stage waits for GPUs (once per change of reason).
    Waiting { stage: usize, why: String },
    /// No further stage runs on this GPU (`on_leak = "quarantine"`).
    Quarantine(String),
    /// No further stage starts, for this reason (said once per cause).
    Stop(Stopping),
    /// Pass the cancel on to the running stages.
    CancelStages(CancelLevel),
    /// Files prepared ahead for this stage will not be used: release them.
    ReleaseFiles(usize),
    /// Give this running stage's GPUs back to the pool now (it released them); they are not
    /// given back again at its end.
    GiveBackGpus(usize),
    /// Stop this stage's attempt now, its whole tree, as a cancel would (it started early and
    /// an upstream it started ahead of failed); its end follows and is not counted.
    StopStage(usize),
    /// This stage's success is recorded (the [`Action::Finished`] before this one) and an
    /// early attempt of it left the early-start mark in its directory: remove the mark.
    ClearEarlyMark(usize),
    /// This stage has ended with a successor planned after it
    /// ([`Scheduler::successor_planned`]), which has started by now or never will: give back
    /// what was prepared for it if it did not start (the run loop starts it the ordinary way,
    /// if it still should).
    AbandonSuccessor(usize),
}

/// An attempt to start, as [`Scheduler::next_start`] chose it.
#[derive(Debug, PartialEq)]
pub(crate) enum Start {
    /// A stage an ending stage already started in its slot: record it.
    HandedOver(usize),
    /// Start attempt `attempt` of `stage` on `gpus`; `cpu_threads`: the threads a built-in
    /// stage on the CPU should use (shared with the other built-in CPU stages);
    /// `being_written`: an early start, ahead of these upstream stages, which still persist
    /// their outputs (empty for an ordinary start).
    Fresh {
        stage: usize,
        attempt: u32,
        gpus: Vec<GpuInfo>,
        cpu_threads: Option<usize>,
        being_written: Vec<usize>,
    },
}

/// What the host offers the stages about to start: GPUs and the CPU.
pub(crate) trait Resources {
    /// GPUs not quarantined.
    fn usable_gpus(&self) -> usize;
    /// All GPUs of the machine.
    fn total_gpus(&self) -> usize;
    /// Takes `n` GPUs for `stage`, none of `avoid`, or says why it must wait.
    fn take_gpus(
        &mut self,
        stage: usize,
        n: usize,
        avoid: &[String],
    ) -> Result<Vec<GpuInfo>, String>;
    /// Built-in stages running on the CPU, this run's and other runs' of the host.
    fn cpu_builtins_running(&self) -> usize;
    /// The host's CPU cores.
    fn cpus(&self) -> usize;
}

/// How a run ended, as the scheduler decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every stage succeeded and every GPU check passed.
    Succeeded,
    /// Every stage succeeded, but a GPU leaked (`on_leak` other than `fail`).
    SucceededLeaked,
    /// A stage failed or was skipped.
    Failed,
    /// A GPU leaked and `on_leak = "fail"`.
    Leaked,
    /// The run was cancelled.
    Interrupted,
}

/// The state of one run: every stage's, the ready set, the slots, and the stop.
pub(crate) struct Scheduler<'p> {
    plan: &'p LoadedPlan,
    rules: Rules,
    states: Vec<StageState>,
    /// Each stage's place in the plan's order (ready stages start in that order).
    position: Vec<usize>,
    /// Per stage: upstream stages not yet succeeded.
    waiting_on: Vec<usize>,
    /// Stages ready to start, by position.
    ready: BTreeSet<(usize, usize)>,
    /// Failed stages waiting for their retry, and when it is due.
    retry_queue: Vec<(Instant, usize)>,
    /// Stages holding a slot (at most `max_parallel`, hand-overs aside).
    slots_held: usize,
    /// Attempts whose result has not come, and whether each may hand over.
    live: BTreeMap<usize, bool>,
    /// Stages that gave their slot back before their result.
    freed_early: FastSet<usize>,
    /// Running stages whose GPUs went back to the pool at their release.
    gpus_released: FastSet<usize>,
    /// Running stages that released their GPUs and whose downstream stages may start early.
    persisting: FastSet<usize>,
    /// Per stage: upstream stages in `persisting`.
    waiting_persisting: Vec<usize>,
    /// Stages started early: the upstream stages they started ahead of that have not ended.
    ahead_of: BTreeMap<usize, Vec<usize>>,
    /// Attempts that started early and have not ended (whatever their upstream stages did).
    early: FastSet<usize>,
    /// Of those, the ones whose `init` stage is one they started ahead of: that stage.
    awaiting_init: BTreeMap<usize, usize>,
    /// Early attempts that ended before those upstream stages: their outcome, held.
    held: BTreeMap<usize, Outcome>,
    /// Those attempts' results, kept for their record until their end is concluded.
    held_results: BTreeMap<usize, Box<AttemptResult>>,
    /// Held results whose end the last events concluded, for the run loop to record
    /// ([`Scheduler::take_concluded`]).
    concluded: Vec<(usize, Box<AttemptResult>)>,
    /// Early attempts still running whose upstream (the value) failed: stopped, their end void.
    voided: BTreeMap<usize, usize>,
    /// Per stage: attempts not counted against its retries (voided early attempts).
    uncharged: Vec<u32>,
    /// Per stage: the GPUs of its last attempt that an XID hit (`retry_on = ["xid"]`; its
    /// retry avoids them where enough other GPUs are usable).
    xid_hit: Vec<Vec<String>>,
    /// Per stage: its last attempt was lost with its Slurm node (`retry_on = ["lost"]`).
    lost: Vec<bool>,
    /// Per stage: the highest step any attempt reported, and how many attempts in a row
    /// since did not pass it (see [`NO_PROGRESS_RESTARTS`]).
    progress: Vec<(Option<u64>, u32)>,
    /// Stages an ending stage started in its place, not yet recorded.
    handed: Vec<usize>,
    /// The successor planned to start the moment the one running stage ends
    /// ([`Scheduler::successor_planned`]): the stage it follows, itself, and when it starts.
    next_up: Option<(usize, usize, handover::Kind)>,
    /// Stages an early attempt of which launched in this run: their directory holds the
    /// early-start mark until their success is recorded ([`Action::ClearEarlyMark`]).
    marked: BTreeSet<usize>,
    /// Why the run starts nothing more (empty while it goes on).
    stops: BTreeSet<Stopping>,
    leaked_any: bool,
    /// Per stage: why it waits for GPUs (told once per change).
    waiting_why: BTreeMap<usize, String>,
    /// Within one round of starts: the last ready stage looked at.
    cursor: Option<(usize, usize)>,
    /// Within one round: whether a stage was left waiting for GPUs.
    gpu_waiting: bool,
    /// Fresh starts paced by this bucket (job steps over an allocation), if any.
    pacing: Option<crate::slurm::pacing::TokenBucket>,
    /// The current round's time, and when the pacing lets the next start go, if it held one.
    round_at: Option<Instant>,
    paced_until: Option<Instant>,
}

impl<'p> Scheduler<'p> {
    /// A run of `plan` whose stages stand as `states` (pending, or kept by a resume).
    pub(crate) fn new(plan: &'p LoadedPlan, rules: Rules, states: Vec<StageState>) -> Self {
        let n = states.len();
        let mut position = vec![0; n];
        for (p, &i) in plan.order.iter().enumerate() {
            position[i] = p;
        }
        let waiting_on: Vec<usize> = plan
            .upstream
            .iter()
            .map(|ups| {
                ups.iter()
                    .filter(|&&u| states[u].status != Status::Succeeded)
                    .count()
            })
            .collect();
        let ready = (0..states.len())
            .filter(|&i| waiting_on[i] == 0 && states[i].status == Status::Pending)
            .map(|i| (position[i], i))
            .collect();
        Scheduler {
            plan,
            rules: Rules {
                max_parallel: rules.max_parallel.max(1),
                ..rules
            },
            states,
            position,
            waiting_on,
            ready,
            retry_queue: Vec::new(),
            slots_held: 0,
            live: BTreeMap::new(),
            freed_early: FastSet::default(),
            gpus_released: FastSet::default(),
            persisting: FastSet::default(),
            waiting_persisting: vec![0; n],
            ahead_of: BTreeMap::new(),
            early: FastSet::default(),
            awaiting_init: BTreeMap::new(),
            held: BTreeMap::new(),
            held_results: BTreeMap::new(),
            concluded: Vec::new(),
            voided: BTreeMap::new(),
            uncharged: vec![0; n],
            xid_hit: vec![Vec::new(); n],
            lost: vec![false; n],
            progress: vec![(None, 0); n],
            handed: Vec::new(),
            next_up: None,
            marked: BTreeSet::new(),
            stops: BTreeSet::new(),
            leaked_any: false,
            waiting_why: BTreeMap::new(),
            cursor: None,
            gpu_waiting: false,
            pacing: None,
            round_at: None,
            paced_until: None,
        }
    }

    /// Paces fresh starts by `bucket` (at most its rate; `crate::slurm::pacing`).
    pub(crate) fn pace_starts(&mut self, bucket: crate::slurm::pacing::TokenBucket) {
        self.pacing = Some(bucket);
    }

    /// When the loop must look again even if nothing happens: the next retry, or the next
    /// start the pacing held back.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.next_retry().into_iter().chain(self.paced_until).min()
    }

    /// Every stage's state, by index.
    pub(crate) fn states(&self) -> &Vec<StageState> {
        &self.states
    }

    /// Keeps stage `i`'s attempt's result once its end was carried out, while its end is held
    /// ([`Scheduler::is_held`]), until the scheduler concludes it (then
    /// [`Scheduler::take_concluded`] gives it back to be recorded); a result whose end was
    /// recorded is not kept (the report kept what it needs from its record).
    pub(crate) fn keep_result(&mut self, i: usize, result: Box<AttemptResult>) {
        if self.is_held(i) {
            self.held_results.insert(i, result);
        }
    }

    /// The held results whose end was concluded since the last call (each has its
    /// [`Action::Finished`] among the actions just returned), in the order concluded: to record
    /// with that action.
    pub(crate) fn take_concluded(&mut self) -> Vec<(usize, Box<AttemptResult>)> {
        std::mem::take(&mut self.concluded)
    }

    /// Stage `d`'s held end is concluded: its result goes to the run loop.
    fn release_held(&mut self, d: usize) -> Option<Outcome> {
        let outcome = self.held.remove(&d)?;
        if let Some(result) = self.held_results.remove(&d) {
            self.concluded.push((d, result));
        }
        Some(outcome)
    }

    /// Why no further stage starts, if it does not.
    pub(crate) fn stopping(&self) -> Option<Stopping> {
        self.stops.last().copied()
    }

    /// Whether the last round of starts left a stage waiting for GPUs.
    pub(crate) fn gpu_waiting(&self) -> bool {
        self.gpu_waiting
    }

    /// When the next retry is due.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.retry_queue.iter().map(|&(t, _)| t).min()
    }

    /// Whether stage `i`'s GPUs are still its own (not given back at a release): its end
    /// gives them back.
    pub(crate) fn holds_gpus(&self, i: usize) -> bool {
        !self.gpus_released.contains(&i)
    }

    /// Whether stage `i`'s attempt, running, started early (ahead of an upstream stage still
    /// persisting its outputs): it neither frees its slot early nor hands it over, may be
    /// stopped alone, and its report says so. False once its end came.
    pub(crate) fn started_early(&self, i: usize) -> bool {
        self.early.contains(&i)
    }

    /// The number of stage `i`'s latest attempt (0 before its first).
    pub(crate) fn attempts(&self, i: usize) -> u32 {
        self.states[i].attempts
    }

    /// The running early starts whose `init` stage has now succeeded, each with that stage,
    /// given once: the run loop looks whether it wrote the checkpoint manifest it promised
    /// (the built-in train stage always does; a command stage that opted in may not), and
    /// sends [`Event::InputMissing`] if it did not.
    pub(crate) fn take_inits_succeeded(&mut self) -> Vec<(usize, usize)> {
        let states = &self.states;
        let succeeded: Vec<(usize, usize)> = self
            .awaiting_init
            .iter()
            .filter(|&(_, &u)| states[u].status == Status::Succeeded)
            .map(|(&d, &u)| (d, u))
            .collect();
        for (d, _) in &succeeded {
            self.awaiting_init.remove(d);
        }
        succeeded
    }

    /// Whether stage `i`'s attempt ended and its result is held (it started early and an
    /// upstream it started ahead of has not ended yet).
    pub(crate) fn is_held(&self, i: usize) -> bool {
        self.held.contains_key(&i)
    }

    /// Stages holding a slot.
    #[cfg(test)]
    pub(crate) fn slots_held(&self) -> usize {
        self.slots_held
    }

    /// Whether the run is over: nothing runs and nothing more will start.
    pub(crate) fn is_done(&self) -> bool {
        self.slots_held == 0
            && self.live.is_empty()
            && (!self.stops.is_empty() || (self.ready.is_empty() && self.retry_queue.is_empty()))
    }

    /// The ready stages in the order they start.
    pub(crate) fn ready(&self) -> impl Iterator<Item = usize> + '_ {
        self.ready.iter().map(|&(_, i)| i)
    }

    /// How many ready stages (at most `limit`) start before `stage` would.
    pub(crate) fn ready_before(&self, stage: usize, limit: usize) -> usize {
        self.ready
            .range(..(self.position[stage], stage))
            .take(limit)
            .count()
    }

    /// Whether `stage` waits on exactly one upstream stage that has not succeeded.
    pub(crate) fn waits_on_one(&self, stage: usize) -> bool {
        self.waiting_on[stage] == 1
    }

    /// The stage to plan now to start the moment the one running stage ends, and how
    /// ([`handover`]): only while none is planned and exactly one stage runs, alone (no
    /// hand-over, retry or GPU wait pending, not stopping, no early start unsettled), and only
    /// a command stage's first attempt on the CPU. The
    /// first ready stage takes its slot (with `max_parallel = 1`, not with `fail_fast`); with
    /// none ready, the first stage that waits on it alone follows it as a chain.
    pub(crate) fn handover_candidate(&self) -> Option<(usize, usize, handover::Kind)> {
        if !self.stops.is_empty()
            || self.slots_held != 1
            || self.live.len() != 1
            || !self.handed.is_empty()
            || self.next_up.is_some()
            || !self.retry_queue.is_empty()
            || self.gpu_waiting
            || !self.ahead_of.is_empty()
            || !self.voided.is_empty()
        {
            return None;
        }
        let (&i, &may_hand_over) = self.live.iter().next()?;
        if !may_hand_over {
            return None;
        }
        let (j, kind) = match self.ready.iter().next() {
            Some(&(_, j)) => (self.rules.max_parallel == 1 && !self.rules.fail_fast)
                .then_some((j, handover::Kind::Slot))?,
            None => self.plan.downstream[i]
                .iter()
                .copied()
                .filter(|&d| self.waiting_on[d] == 1 && self.states[d].status == Status::Pending)
                .min_by_key(|&d| self.position[d])
                .map(|d| (d, handover::Kind::Chain))?,
        };
        let eligible = self.states[j].attempts == 0 && !self.is_builtin(j) && self.on_cpu(j);
        eligible.then_some((i, j, kind))
    }

    /// The run loop planned stage `stage` to start after stage `after` at `kind` (a
    /// [`Scheduler::handover_candidate`] it could prepare): no other is offered until `after`
    /// hands over or ends.
    pub(crate) fn successor_planned(&mut self, after: usize, stage: usize, kind: handover::Kind) {
        debug_assert!(self.next_up.is_none(), "a second successor planned");
        self.next_up = Some((after, stage, kind));
    }

    /// The successor planned, if one is: the stage it follows, itself, and when it starts.
    #[cfg(test)]
    pub(crate) fn next_up(&self) -> Option<(usize, usize, handover::Kind)> {
        self.next_up
    }

    /// The successor planned after stage `after`, if any, is no longer planned; whether one was.
    fn forget_successor_of(&mut self, after: usize) -> bool {
        let planned = self.next_up.is_some_and(|(a, _, _)| a == after);
        if planned {
            self.next_up = None;
        }
        planned
    }

    /// Begins a round of starts at `now`: retries that are due become ready.
    pub(crate) fn begin_round(&mut self, now: Instant) {
        let (position, ready) = (&self.position, &mut self.ready);
        self.retry_queue.retain(|&(t, i)| {
            if t <= now {
                ready.insert((position[i], i));
                false
            } else {
                true
            }
        });
        self.cursor = None;
        self.gpu_waiting = false;
        self.round_at = Some(now);
        self.paced_until = None;
    }

    /// The next attempt to start in this round, if any: first the stages an ending stage
    /// started in its place (even while stopping: they run already), then ready stages in
    /// order while slots are free and the run is not stopping. A stage that needs more GPUs
    /// than remain usable fails here; one whose GPUs are busy is passed over (its reason in
    /// `actions` once per change) until the next round.
    pub(crate) fn next_start(
        &mut self,
        resources: &mut dyn Resources,
        actions: &mut Vec<Action>,
    ) -> Option<Start> {
        if let Some(i) = self.handed.pop() {
            self.ready.remove(&(self.position[i], i));
            self.occupy(i);
            return Some(Start::HandedOver(i));
        }
        while self.stops.is_empty() && self.slots_held < self.rules.max_parallel {
            let next = match self.cursor {
                None => self.ready.iter().next(),
                Some(c) => self
                    .ready
                    .range((Bound::Excluded(c), Bound::Unbounded))
                    .next(),
            };
            let &(pos, i) = next?;
            if let (Some(bucket), Some(now)) = (&mut self.pacing, self.round_at) {
                if let Some(at) = bucket.next_at(now) {
                    self.paced_until = Some(at);
                    return None;
                }
            }
            self.cursor = Some((pos, i));
            if let Some(start) = self.try_start(i, resources, actions) {
                if let (Some(bucket), Some(now)) = (&mut self.pacing, self.round_at) {
                    bucket.take(now);
                }
                return Some(start);
            }
        }
        None
    }

    /// Stage `i`'s start if its GPUs can be had now.
    fn try_start(
        &mut self,
        i: usize,
        resources: &mut dyn Resources,
        actions: &mut Vec<Action>,
    ) -> Option<Start> {
        let want = if self.rules.machine_has_gpus {
            self.plan.plan.stages[i].gpus_wanted() as usize
        } else {
            0
        };
        let usable = resources.usable_gpus();
        if want > usable {
            self.ready.remove(&(self.position[i], i));
            let message = format!(
                "needs {want} GPU(s) but only {usable} are usable ({} quarantined after leaks or GPU faults)",
                resources.total_gpus() - usable
            );
            self.fail_without_attempt(i, FailureClass::NoGpu, message, actions);
            return None;
        }
        let gpus = if want == 0 {
            Vec::new()
        } else {
            // A retry after an XID runs elsewhere when enough other GPUs are usable.
            let avoid: &[String] = match usable >= want + self.xid_hit[i].len() {
                true => &self.xid_hit[i],
                false => &[],
            };
            match resources.take_gpus(i, want, avoid) {
                Ok(gpus) => {
                    self.waiting_why.remove(&i);
                    gpus
                }
                Err(why) => {
                    self.gpu_waiting = true;
                    if self.waiting_why.get(&i) != Some(&why) {
                        actions.push(Action::Waiting {
                            stage: i,
                            why: why.clone(),
                        });
                        self.waiting_why.insert(i, why);
                    }
                    return None;
                }
            }
        };
        self.ready.remove(&(self.position[i], i));
        let cpu_threads = (self.is_builtin(i) && gpus.is_empty())
            .then(|| self.cpu_threads(resources.cpu_builtins_running(), resources.cpus()));
        self.occupy(i);
        // Ready with upstream stages that did not succeed: they persist their outputs.
        let being_written: Vec<usize> = self.plan.upstream[i]
            .iter()
            .copied()
            .filter(|&u| self.states[u].status != Status::Succeeded)
            .collect();
        if !being_written.is_empty() {
            self.ahead_of.insert(i, being_written.clone());
            self.early.insert(i);
            let init = self.plan.plan.stages[i].init.as_deref();
            let stages = &self.plan.plan.stages;
            if let Some(&u) = being_written
                .iter()
                .find(|&&u| init == Some(stages[u].name.as_str()))
            {
                self.awaiting_init.insert(i, u);
            }
        }
        Some(Start::Fresh {
            stage: i,
            attempt: self.states[i].attempts,
            gpus,
            cpu_threads,
            being_written,
        })
    }

    /// Stage `i` takes a slot for a new attempt.
    fn occupy(&mut self, i: usize) {
        self.states[i].attempts += 1;
        self.states[i].status = Status::Running;
        self.slots_held += 1;
        self.live.insert(i, false);
    }

    fn is_builtin(&self, i: usize) -> bool {
        self.plan.plan.stages[i].kind.is_some()
    }

    /// Whether stage `i` runs on the CPU (it asks for no GPU, or the machine has none).
    pub(crate) fn on_cpu(&self, i: usize) -> bool {
        self.plan.plan.stages[i].gpus_wanted() == 0 || !self.rules.machine_has_gpus
    }

    /// Built-in CPU stages that run side by side share the cores instead of each starting a
    /// thread per core: the cores divided among those running, this one, and those ready.
    fn cpu_threads(&self, running: usize, cpus: usize) -> usize {
        let ready_cpu = self
            .ready
            .iter()
            .filter(|&&(_, j)| self.is_builtin(j) && self.on_cpu(j))
            .take(self.rules.max_parallel)
            .count();
        let sharing = (running + ready_cpu + 1)
            .min(self.rules.max_parallel)
            .max(1);
        (cpus / sharing).max(1)
    }

    /// Takes in one event; what it asks the run loop to do, in order.
    pub(crate) fn on(&mut self, event: Event<'_>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match event {
            Event::Launched {
                stage,
                may_hand_over,
            } => {
                self.live.insert(stage, may_hand_over);
                // The early-start mark is written before an early attempt spawns.
                if self.early.contains(&stage) {
                    self.marked.insert(stage);
                }
            }
            Event::StartFailed {
                stage,
                class,
                message,
            } => {
                self.slots_held -= 1;
                self.live.remove(&stage);
                self.ahead_of.remove(&stage);
                self.early.remove(&stage);
                self.awaiting_init.remove(&stage);
                self.fail_without_attempt(stage, class, message, &mut actions);
            }
            Event::SlotFreed(stage) => {
                self.slots_held -= 1;
                self.freed_early.insert(stage);
            }
            Event::HandedOver { from, to } => {
                // It took the successor planned after it.
                self.forget_successor_of(from);
                self.slots_held -= 1;
                self.freed_early.insert(from);
                self.handed.push(to);
            }
            // Only a running stage that was given GPUs, once: a late or repeated release
            // (after its end, on the CPU) gives nothing back that another stage now holds.
            Event::GpusReleased {
                stage,
                downstream_may_start,
            } => {
                if self.live.contains_key(&stage)
                    && !self.on_cpu(stage)
                    && self.gpus_released.insert(stage)
                {
                    actions.push(Action::GiveBackGpus(stage));
                    if downstream_may_start && self.rules.early_start {
                        self.persisting.insert(stage);
                        let plan = self.plan;
                        for &d in &plan.downstream[stage] {
                            self.waiting_persisting[d] += 1;
                            self.refresh(d);
                        }
                    }
                }
            }
            Event::AttemptEnded {
                stage,
                result,
                chained,
            } => self.attempt_ended(stage, result, chained, now, &mut actions),
            Event::InputMissing { stage, upstream } => {
                if self.live.contains_key(&stage) && !self.voided.contains_key(&stage) {
                    self.voided.insert(stage, upstream);
                    actions.push(Action::StopStage(stage));
                }
            }
            Event::Cancel(level) => self.cancel(level, &mut actions),
        }
        actions
    }

    /// Stage `stage`'s attempt ended with `result` (`chained`: the successor it started): its
    /// slot and GPUs' verdicts, then its end concluded, held (it started early, ahead of an
    /// upstream still running) or void.
    fn attempt_ended(
        &mut self,
        stage: usize,
        result: &AttemptResult,
        chained: Option<usize>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if self.forget_successor_of(stage) {
            out.push(Action::AbandonSuccessor(stage));
        }
        self.handed.extend(chained);
        self.live.remove(&stage);
        self.early.remove(&stage);
        self.awaiting_init.remove(&stage);
        self.gpus_released.remove(&stage);
        if !self.freed_early.remove(&stage) {
            self.slots_held -= 1;
        }
        self.judge_gpus(result, out);
        self.xid_hit[stage] = result
            .gpu
            .iter()
            .filter(|g| !g.xids.is_empty())
            .map(|g| g.uuid.clone())
            .collect();
        note_progress(&mut self.progress[stage], result.last_step);
        self.lost[stage] = result.lost_on.is_some();
        self.stop_persisting(stage);
        if let Some(upstream) = self.voided.remove(&stage) {
            self.void(stage, upstream, now, out);
        } else if self.ahead_of.contains_key(&stage) {
            self.held.insert(stage, result.outcome.clone());
        } else {
            self.conclude(stage, &result.outcome, now, out);
        }
    }

    /// Leaked GPUs under `on_leak`; a GPU hit by an XID whose recovery needs a reset is
    /// quarantined whatever `on_leak` says (`crate::gpu::health`).
    fn judge_gpus(&mut self, result: &AttemptResult, actions: &mut Vec<Action>) {
        for g in &result.gpu {
            if g.xids.iter().any(|x| x.needs_reset) {
                actions.push(Action::Quarantine(g.uuid.clone()));
            }
        }
        for g in result
            .gpu
            .iter()
            .filter(|g| g.verdict == GpuVerdict::Leaked && !g.xids.iter().any(|x| x.needs_reset))
        {
            self.leaked_any = true;
            match self.rules.on_leak {
                OnLeak::Quarantine => actions.push(Action::Quarantine(g.uuid.clone())),
                OnLeak::Fail => self.stop_for(Stopping::GpuLeaked, actions),
                OnLeak::Warn => {}
            }
        }
    }

    /// Whether stage `d` may start now: pending, not handed over, and every upstream stage
    /// succeeded — or, for a built-in stage with early starts on, every one that did not is
    /// persisting its outputs after its release.
    fn is_ready(&self, d: usize) -> bool {
        let early = self.rules.early_start
            && self.is_builtin(d)
            && self.waiting_on[d] == self.waiting_persisting[d];
        self.states[d].status == Status::Pending
            && (self.waiting_on[d] == 0 || early)
            && !self.handed.contains(&d)
    }

    /// Puts pending stage `d` in the ready set or takes it out, as [`Scheduler::is_ready`]
    /// says (a due retry, which is not pending, is left where it is).
    fn refresh(&mut self, d: usize) {
        if self.states[d].status != Status::Pending {
            return;
        }
        let key = (self.position[d], d);
        if self.is_ready(d) {
            self.ready.insert(key);
        } else {
            self.ready.remove(&key);
        }
    }

    /// Stage `u` ended: its downstream stages no longer count it as persisting.
    fn stop_persisting(&mut self, u: usize) {
        if self.persisting.remove(&u) {
            let plan = self.plan;
            for &d in &plan.downstream[u] {
                self.waiting_persisting[d] -= 1;
                self.refresh(d);
            }
        }
    }

    /// Stage `u` was concluded: the stages that started ahead of it are concluded with their
    /// held outcome once nothing else holds them (it succeeded), or are void (it did not):
    /// stopped if they still run, else recorded as stopped and started again later.
    fn settle_ahead(&mut self, u: usize, now: Instant, out: &mut Vec<Action>) {
        let succeeded = self.states[u].status == Status::Succeeded;
        let plan = self.plan;
        for &d in &plan.downstream[u] {
            let Some(ups) = self.ahead_of.get_mut(&d) else {
                continue;
            };
            let Some(k) = ups.iter().position(|&x| x == u) else {
                continue;
            };
            if succeeded {
                ups.swap_remove(k);
                if !ups.is_empty() {
                    continue;
                }
                self.ahead_of.remove(&d);
                if let Some(outcome) = self.release_held(d) {
                    self.conclude(d, &outcome, now, out);
                }
            } else {
                self.ahead_of.remove(&d);
                if self.release_held(d).is_some() {
                    self.void(d, u, now, out);
                } else if self.live.contains_key(&d) {
                    self.voided.insert(d, u);
                    out.push(Action::StopStage(d));
                }
            }
        }
    }

    /// Stage `d`'s early attempt is void (`upstream`, which it started ahead of, did not
    /// succeed, or succeeded without the checkpoint it promised): recorded as stopped, not
    /// counted against its retries; it waits again for its upstream stages, or is skipped if
    /// one of them failed for good.
    fn void(&mut self, d: usize, upstream: usize, now: Instant, out: &mut Vec<Action>) {
        self.uncharged[d] += 1;
        self.ahead_of.remove(&d);
        let up = &self.plan.plan.stages[upstream].name;
        let why = match self.states[upstream].status {
            Status::Succeeded => "which finished without the checkpoint manifest it promised",
            _ => "which did not succeed",
        };
        out.push(Action::Finished {
            stage: d,
            attempt: self.states[d].attempts,
            status: StageStatus::Cancelled,
            error: Some(format!(
                "stopped: it started early, before its upstream stage `{up}` finished, {why}; not counted against its retries"
            )),
            failure: None,
            retry_in: None,
            runs_again: true,
        });
        self.states[d].status = Status::Pending;
        let plan = self.plan;
        let gone = plan.upstream[d]
            .iter()
            .copied()
            .find(|&u| matches!(self.states[u].status, Status::Failed | Status::Skipped(..)));
        match gone {
            Some(u) => {
                self.skip_for_upstream(d, u, out);
                self.skip_downstream(d, out);
                out.extend(plan.downstream[d].iter().map(|&x| Action::ReleaseFiles(x)));
            }
            None => self.refresh(d),
        }
        self.settle_ahead(d, now, out);
    }

    /// What an attempt's end means for its stage and the stages after it (and for the stages
    /// that started ahead of it).
    fn conclude(&mut self, i: usize, outcome: &Outcome, now: Instant, out: &mut Vec<Action>) {
        self.conclude_own(i, outcome, now, out);
        self.settle_ahead(i, now, out);
    }

    fn conclude_own(&mut self, i: usize, outcome: &Outcome, now: Instant, out: &mut Vec<Action>) {
        let attempt = self.states[i].attempts;
        // Voided early attempts are not counted.
        let charged = attempt - self.uncharged[i];
        let finished = |status, error, failure, retry_in: Option<Duration>| Action::Finished {
            stage: i,
            attempt,
            status,
            error,
            failure,
            retry_in,
            runs_again: retry_in.is_some(),
        };
        match outcome {
            Outcome::Succeeded => {
                out.push(finished(StageStatus::Succeeded, None, None, None));
                if self.marked.remove(&i) {
                    out.push(Action::ClearEarlyMark(i));
                }
                self.states[i].status = Status::Succeeded;
                self.release_downstream(i);
            }
            Outcome::Failed(failure) => {
                let message = failure.describe();
                let stage = &self.plan.plan.stages[i];
                let retry_on = stage
                    .retry_on
                    .as_ref()
                    .or(self.plan.plan.run.retry_on.as_ref());
                let wanted = match retry_on {
                    Some(causes) => causes
                        .iter()
                        .any(|c| failure.matches(c, !self.xid_hit[i].is_empty(), self.lost[i])),
                    None => failure.retryable(stage.retry_oom),
                };
                let (best, stuck) = self.progress[i];
                let stuck = stuck >= NO_PROGRESS_RESTARTS;
                let retry = wanted
                    && !stuck
                    && charged <= stage.retries
                    && !self.stops.contains(&Stopping::Interrupted);
                let retry_in = retry.then(|| retry_backoff(charged));
                let message = match (wanted && stuck && charged <= stage.retries, best) {
                    (true, Some(step)) => format!(
                        "{message}; not retried: {NO_PROGRESS_RESTARTS} restarts in a row got no further than step {step}"
                    ),
                    _ => message,
                };
                out.push(finished(
                    StageStatus::Failed,
                    Some(message),
                    Some(failure.class()),
                    retry_in,
                ));
                match retry_in {
                    Some(wait) => {
                        let at = now + wait;
                        self.states[i].status = Status::RetryAt(at);
                        self.retry_queue.push((at, i));
                    }
                    None => self.fail(i, out),
                }
            }
            Outcome::Cancelled => {
                // Its downstream stages are skipped as interrupted when the run ends (a cancel
                // is what stops a stage here).
                let why = Some("stopped by a signal".to_string());
                out.push(finished(StageStatus::Cancelled, why, None, None));
                self.states[i].status = Status::Cancelled;
            }
        }
    }

    /// Stage `i` succeeded: the stages waiting on it alone become ready (a successor it
    /// started itself is recorded by the next round instead).
    fn release_downstream(&mut self, i: usize) {
        let plan = self.plan;
        for &d in &plan.downstream[i] {
            self.waiting_on[d] -= 1;
            self.refresh(d);
        }
    }

    /// Records a stage that failed before any of its processes started, and its consequences.
    fn fail_without_attempt(
        &mut self,
        i: usize,
        class: FailureClass,
        message: String,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Finished {
            stage: i,
            attempt: self.states[i].attempts,
            status: StageStatus::Failed,
            error: Some(message),
            failure: Some(class),
            retry_in: None,
            runs_again: false,
        });
        self.fail(i, out);
    }

    /// Stage `i` failed for good: everything downstream of it is skipped, and with
    /// `fail_fast` the run stops.
    fn fail(&mut self, i: usize, out: &mut Vec<Action>) {
        self.states[i].status = Status::Failed;
        self.skip_downstream(i, out);
        // Only stages waiting on it alone were opened ahead.
        out.extend(
            self.plan.downstream[i]
                .iter()
                .map(|&d| Action::ReleaseFiles(d)),
        );
        if self.rules.fail_fast {
            self.stop_for(Stopping::FailFast, out);
        }
    }

    /// Every stage downstream of `failed` (transitively) that has not run is skipped, each
    /// once, naming the stage it waited on.
    fn skip_downstream(&mut self, failed: usize, out: &mut Vec<Action>) {
        let plan = self.plan;
        let mut stack = vec![failed];
        while let Some(u) = stack.pop() {
            for &d in &plan.downstream[u] {
                if matches!(self.states[d].status, Status::Pending | Status::RetryAt(_)) {
                    self.skip_for_upstream(d, u, out);
                    stack.push(d);
                }
            }
        }
    }

    /// Stage `d` is skipped because its upstream `u` did not succeed.
    fn skip_for_upstream(&mut self, d: usize, u: usize, out: &mut Vec<Action>) {
        let reason = format!(
            "upstream stage `{}` did not succeed",
            self.plan.plan.stages[u].name
        );
        let class = FailureClass::UpstreamFailed;
        self.states[d].status = Status::Skipped(class, reason.clone());
        out.push(Action::Skipped {
            stage: d,
            class,
            reason,
        });
    }

    /// The run starts nothing more, for `cause` (said once per cause).
    fn stop_for(&mut self, cause: Stopping, out: &mut Vec<Action>) {
        if self.stops.insert(cause) {
            out.push(Action::Stop(cause));
        }
    }

    /// A cancel: the running stages are told (once per level; a kill each time), nothing
    /// more starts, and the run ends interrupted.
    fn cancel(&mut self, level: CancelLevel, out: &mut Vec<Action>) {
        match level {
            CancelLevel::None => {}
            CancelLevel::Graceful => {
                if !self.stops.contains(&Stopping::Interrupted) {
                    self.stop_for(Stopping::Interrupted, out);
                    out.push(Action::CancelStages(CancelLevel::Graceful));
                }
            }
            CancelLevel::Kill => {
                self.stop_for(Stopping::Interrupted, out);
                out.push(Action::CancelStages(CancelLevel::Kill));
            }
        }
    }

    /// The run was stopped as it ended (inside Slurm, a stop that came with the last stage's
    /// end): it ends interrupted, with nothing left to tell.
    pub(crate) fn note_interrupted(&mut self) {
        self.stops.insert(Stopping::Interrupted);
    }

    /// Ends the run: every stage that did not start is skipped for the run's stop, and the
    /// run's verdict.
    pub(crate) fn finish(&mut self) -> (Vec<Action>, Verdict) {
        let mut out = Vec::new();
        let (class, reason) = self.stopping().unwrap_or(Stopping::GpuLeaked).skip_reason();
        for (i, state) in self.states.iter_mut().enumerate() {
            if matches!(state.status, Status::Pending | Status::RetryAt(_)) {
                state.status = Status::Skipped(class, reason.to_string());
                out.push(Action::Skipped {
                    stage: i,
                    class,
                    reason: reason.to_string(),
                });
            }
        }
        let any_failed = self
            .states
            .iter()
            .any(|s| matches!(s.status, Status::Failed | Status::Skipped(..)));
        let leak_stop = self.stops.contains(&Stopping::GpuLeaked);
        let verdict = if self.stops.contains(&Stopping::Interrupted) {
            Verdict::Interrupted
        } else if any_failed && !leak_stop {
            Verdict::Failed
        } else if self.leaked_any && self.rules.on_leak == OnLeak::Fail {
            Verdict::Leaked
        } else if self.leaked_any {
            Verdict::SucceededLeaked
        } else {
            Verdict::Succeeded
        };
        (out, verdict)
    }
}

/// Restarts in a row that got no further than the best step of the stage's earlier attempts,
/// after which a stage that reports progress is not retried any more (its retries would
/// repeat the same failure).
pub const NO_PROGRESS_RESTARTS: u32 = 3;

/// Takes in an attempt's highest step into `(best, restarts without progress)`: a step past
/// the best resets the count; no step, or none past it, adds one once a best is known (a stage
/// that never reports steps is not judged).
fn note_progress(progress: &mut (Option<u64>, u32), last_step: Option<u64>) {
    match (last_step, progress.0) {
        (Some(step), best) if best.is_none_or(|b| step > b) => *progress = (Some(step), 0),
        (_, Some(_)) => progress.1 += 1,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    //! Every scheduling rule, without a process: plans parsed from TOML, attempts ended by
    //! hand, GPUs from a [`Resources`] of the test's own.
    use super::*;
    use crate::attempt::outcome::Failure;
    use crate::plan::parse_plan_toml;
    use protocol::report::GpuRecord;
    use std::path::Path;

    /// A plan of command stages (`name after...` per line) with `[run]` settings `run`.
    fn plan(run: &str, stages: &[(&str, &[&str], &str)]) -> LoadedPlan {
        let mut text = format!("[run]\n{run}\n");
        for (name, after, extra) in stages {
            let after: Vec<String> = after.iter().map(|a| format!("\"{a}\"")).collect();
            text.push_str(&format!(
                "[[stage]]\nname = \"{name}\"\ncommand = [\"true\"]\nafter = [{}]\n{extra}\n",
                after.join(", ")
            ));
        }
        parse_plan_toml(&text, "t.toml", Path::new("/")).expect("the test plan is valid")
    }

    fn rules(max_parallel: usize) -> Rules {
        Rules {
            max_parallel,
            fail_fast: false,
            on_leak: OnLeak::Warn,
            machine_has_gpus: false,
            early_start: false,
        }
    }

    fn scheduler(plan: &LoadedPlan, rules: Rules) -> Scheduler<'_> {
        let states = (0..plan.plan.stages.len())
            .map(|_| StageState::pending(0))
            .collect();
        Scheduler::new(plan, rules, states)
    }

    /// A machine of `n` GPUs, each free unless `busy` says why not.
    struct Gpus {
        free: Vec<GpuInfo>,
        total: usize,
        busy: Option<String>,
        cpus: usize,
        builtins: usize,
        /// Who holds which GPUs.
        held: BTreeMap<usize, Vec<GpuInfo>>,
    }

    impl Gpus {
        fn new(n: usize) -> Gpus {
            Gpus {
                free: (0..n).map(gpu).collect(),
                total: n,
                busy: None,
                cpus: 8,
                builtins: 0,
                held: BTreeMap::new(),
            }
        }

        /// Stage `stage`'s GPUs back to the free list (as the run loop does at its end, or
        /// at `Action::GiveBackGpus`).
        fn give_back(&mut self, stage: usize) {
            let back = self.held.remove(&stage).unwrap_or_default();
            self.free.extend(back);
        }
    }

    fn gpu(i: usize) -> GpuInfo {
        GpuInfo {
            index: i as u32,
            cuda_index: i as u32,
            uuid: format!("GPU-{i}"),
            name: "test".into(),
            total_bytes: 1 << 30,
        }
    }

    impl Resources for Gpus {
        fn usable_gpus(&self) -> usize {
            self.total
        }
        fn total_gpus(&self) -> usize {
            self.total
        }
        fn take_gpus(
            &mut self,
            stage: usize,
            n: usize,
            _avoid: &[String],
        ) -> Result<Vec<GpuInfo>, String> {
            if let Some(why) = &self.busy {
                return Err(why.clone());
            }
            if self.free.len() < n {
                return Err("not enough".into());
            }
            let taken: Vec<GpuInfo> = self.free.drain(..n).collect();
            self.held.insert(stage, taken.clone());
            Ok(taken)
        }
        fn cpu_builtins_running(&self) -> usize {
            self.builtins
        }
        fn cpus(&self) -> usize {
            self.cpus
        }
    }

    /// Starts everything the scheduler starts now; the stages started, and the actions.
    fn round(s: &mut Scheduler<'_>, gpus: &mut Gpus, now: Instant) -> (Vec<usize>, Vec<Action>) {
        s.begin_round(now);
        let mut actions = Vec::new();
        let mut started = Vec::new();
        while let Some(start) = s.next_start(gpus, &mut actions) {
            let stage = match start {
                Start::HandedOver(i) => i,
                Start::Fresh { stage, .. } => stage,
            };
            s.on(
                Event::Launched {
                    stage,
                    may_hand_over: true,
                },
                now,
            );
            started.push(stage);
        }
        (started, actions)
    }

    fn result(outcome: Outcome) -> AttemptResult {
        let mut r = AttemptResult::early_failure(Failure::Exit(1));
        r.outcome = outcome;
        r
    }

    fn succeeded() -> AttemptResult {
        result(Outcome::Succeeded)
    }

    fn failed(failure: Failure) -> AttemptResult {
        result(Outcome::Failed(failure))
    }

    fn leaked(uuid: &str) -> AttemptResult {
        let mut r = succeeded();
        r.gpu.push(GpuRecord {
            uuid: uuid.into(),
            baseline_bytes: 0,
            peak_bytes: 1 << 30,
            after_bytes: 1 << 30,
            reclaim_ms: 0.0,
            verdict: GpuVerdict::Leaked,
            holders: Vec::new(),
            note: None,
            at_release: false,
            xids: Vec::new(),
            unhealthy: None,
        });
        r
    }

    /// Stage `stage` released its GPUs, its outputs not written the checkpoint way.
    fn released(stage: usize) -> Event<'static> {
        Event::GpusReleased {
            stage,
            downstream_may_start: false,
        }
    }

    fn end(s: &mut Scheduler<'_>, stage: usize, r: &AttemptResult, now: Instant) -> Vec<Action> {
        s.on(
            Event::AttemptEnded {
                stage,
                result: r,
                chained: None,
            },
            now,
        )
    }

    fn skipped(actions: &[Action]) -> Vec<(usize, FailureClass, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Skipped {
                    stage,
                    class,
                    reason,
                } => Some((*stage, *class, reason.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_stage_starts_only_after_every_upstream_stage_succeeded() {
        let p = plan(
            "",
            &[("a", &[], ""), ("b", &[], ""), ("c", &["a", "b"], "")],
        );
        let mut s = scheduler(&p, rules(4));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 1]);
        end(&mut s, 0, &succeeded(), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        end(&mut s, 1, &succeeded(), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![2]);
        end(&mut s, 2, &succeeded(), now);
        assert!(s.is_done());
        assert_eq!(s.finish().1, Verdict::Succeeded);
    }

    #[test]
    fn max_parallel_bounds_the_slots_and_ready_stages_start_in_plan_order() {
        let p = plan("", &[("z", &[], ""), ("y", &[], ""), ("x", &[], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        assert_eq!(s.slots_held(), 1);
        // A slot given back early lets the next stage in before the result comes.
        s.on(Event::SlotFreed(0), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        end(&mut s, 0, &succeeded(), now);
        assert_eq!(
            s.slots_held(),
            1,
            "the early-freed slot is not given back twice"
        );
        assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        end(&mut s, 1, &succeeded(), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![2]);
    }

    #[test]
    fn a_run_spread_over_an_allocation_holds_no_more_steps_than_its_cpus_and_retries_a_lost_one_first(
    ) {
        // Three nodes of two CPUs: six placed steps at once, whatever max_parallel says.
        let job = crate::slurm::Allocation::from_vars(|k| {
            let v = match k {
                "SLURM_JOB_ID" => "7",
                "SLURM_JOB_NUM_NODES" => "3",
                "SLURM_JOB_CPUS_PER_NODE" => "2(x3)",
                _ => return None,
            };
            Some(v.to_string())
        });
        let bound = crate::slurm::placement::bound_parallel(Some(64), job.as_ref());
        let names = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"];
        let stages: Vec<(&str, &[&str], &str)> =
            names.iter().map(|n| (*n, &[][..], "retries = 1")).collect();
        let p = plan("", &stages);
        let mut s = scheduler(&p, rules(bound));
        let mut gpus = Gpus::new(0);
        let t0 = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, t0).0, vec![0, 1, 2, 3, 4, 5]);
        // The step of s2 is lost with its node: one slot frees, the next stage takes it…
        end(&mut s, 2, &failed(Failure::Exit(233)), t0);
        assert_eq!(round(&mut s, &mut gpus, t0).0, vec![6]);
        assert_eq!(s.slots_held(), 6);
        // …and once its backoff is over, s2's retry comes before the stages after it.
        end(&mut s, 0, &succeeded(), t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(round(&mut s, &mut gpus, later).0, vec![2]);
        assert_eq!(s.states()[2].attempts, 2);
        assert_eq!(s.states()[0].attempts, 1, "what finished is not run again");
    }

    #[test]
    fn a_retryable_failure_is_retried_after_its_backoff_until_the_retries_are_spent() {
        let p = plan("", &[("a", &[], "retries = 2"), ("b", &["a"], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let t0 = Instant::now();
        round(&mut s, &mut gpus, t0);
        let actions = end(&mut s, 0, &failed(Failure::Exit(3)), t0);
        assert_eq!(
            actions,
            vec![Action::Finished {
                stage: 0,
                attempt: 1,
                status: StageStatus::Failed,
                error: Some("exited with code 3".into()),
                failure: Some(FailureClass::ExitCode),
                retry_in: Some(Duration::from_millis(500)),
                runs_again: true,
            }]
        );
        assert_eq!(s.next_retry(), Some(t0 + Duration::from_millis(500)));
        // Not before its backoff.
        assert!(round(&mut s, &mut gpus, t0 + Duration::from_millis(499))
            .0
            .is_empty());
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(round(&mut s, &mut gpus, t1).0, vec![0]);
        assert_eq!(s.states()[0].attempts, 2);
        // The second retry waits twice as long.
        let actions = end(&mut s, 0, &failed(Failure::Exit(3)), t1);
        let retry_in = match actions[0] {
            Action::Finished { retry_in, .. } => retry_in,
            _ => None,
        };
        assert_eq!(retry_in, Some(Duration::from_secs(1)));
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(round(&mut s, &mut gpus, t2).0, vec![0]);
        // Retries spent: it fails, and its downstream stage is skipped.
        let actions = end(&mut s, 0, &failed(Failure::Exit(3)), t2);
        assert!(matches!(
            actions[0],
            Action::Finished {
                attempt: 3,
                retry_in: None,
                ..
            }
        ));
        assert_eq!(skipped(&actions).len(), 1);
        assert!(s.is_done());
        assert_eq!(s.finish().1, Verdict::Failed);
        assert_eq!(retry_backoff(6), Duration::from_secs(16));
        assert_eq!(
            retry_backoff(60),
            Duration::from_secs(16),
            "the backoff stops growing"
        );
    }

    #[test]
    fn a_failure_that_cannot_pass_on_a_retry_is_not_retried() {
        for failure in [
            Failure::BadInput("x".into()),
            Failure::SpawnFailed("x".into()),
            Failure::MissingOutputs(vec!["m".into()]),
        ] {
            let p = plan("", &[("a", &[], "retries = 5")]);
            let mut s = scheduler(&p, rules(1));
            let now = Instant::now();
            round(&mut s, &mut Gpus::new(0), now);
            let actions = end(&mut s, 0, &failed(failure), now);
            assert!(matches!(
                actions[0],
                Action::Finished { retry_in: None, .. }
            ));
            assert!(s.is_done());
        }
    }

    #[test]
    fn a_failure_skips_every_stage_downstream_naming_the_stage_each_waited_on() {
        let p = plan(
            "",
            &[
                ("a", &[], ""),
                ("b", &["a"], ""),
                ("c", &["b"], ""),
                ("d", &[], ""),
            ],
        );
        let mut s = scheduler(&p, rules(4));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 3]);
        let actions = end(&mut s, 0, &failed(Failure::Exit(1)), now);
        let class = FailureClass::UpstreamFailed;
        assert_eq!(
            skipped(&actions),
            vec![
                (1, class, "upstream stage `a` did not succeed".into()),
                (2, class, "upstream stage `b` did not succeed".into()),
            ]
        );
        assert!(actions.contains(&Action::ReleaseFiles(1)));
        // The independent stage goes on; no stop without fail_fast.
        assert_eq!(s.stopping(), None);
        end(&mut s, 3, &succeeded(), now);
        assert!(s.is_done());
        let (late, verdict) = s.finish();
        assert!(late.is_empty(), "skipped stages are not skipped twice");
        assert_eq!(verdict, Verdict::Failed);
    }

    #[test]
    fn fail_fast_stops_every_further_start_and_skips_what_did_not_start() {
        let p = plan("", &[("a", &[], ""), ("b", &[], ""), ("c", &[], "")]);
        let mut s = scheduler(
            &p,
            Rules {
                fail_fast: true,
                ..rules(2)
            },
        );
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 1]);
        let actions = end(&mut s, 0, &failed(Failure::Exit(1)), now);
        assert_eq!(actions.last(), Some(&Action::Stop(Stopping::FailFast)));
        assert!(round(&mut s, &mut gpus, now).0.is_empty());
        assert!(!s.is_done(), "the running stage is waited for");
        end(&mut s, 1, &succeeded(), now);
        assert!(s.is_done());
        let (actions, verdict) = s.finish();
        assert_eq!(
            skipped(&actions),
            vec![(
                2,
                FailureClass::FailFast,
                "not started: a stage failed and fail_fast = true".into()
            )]
        );
        assert_eq!(verdict, Verdict::Failed);
    }

    #[test]
    fn without_fail_fast_a_failure_stops_nothing_else() {
        let p = plan("", &[("a", &[], ""), ("b", &[], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        let actions = end(&mut s, 0, &failed(Failure::Exit(1)), now);
        assert!(!actions.iter().any(|a| matches!(a, Action::Stop(_))));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
    }

    #[test]
    fn on_leak_quarantine_quarantines_the_gpu_and_the_run_goes_on() {
        let p = plan("", &[("a", &[], "gpus = 1"), ("b", &["a"], "gpus = 1")]);
        let mut s = scheduler(
            &p,
            Rules {
                on_leak: OnLeak::Quarantine,
                machine_has_gpus: true,
                early_start: false,
                ..rules(1)
            },
        );
        let mut gpus = Gpus::new(2);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        let actions = end(&mut s, 0, &leaked("GPU-0"), now);
        assert_eq!(actions[0], Action::Quarantine("GPU-0".into()));
        assert!(matches!(
            actions[1],
            Action::Finished {
                status: StageStatus::Succeeded,
                ..
            }
        ));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        end(&mut s, 1, &succeeded(), now);
        assert_eq!(s.finish().1, Verdict::SucceededLeaked);
    }

    #[test]
    fn on_leak_fail_stops_the_run_once_and_it_ends_leaked() {
        let p = plan("", &[("a", &[], ""), ("b", &[], ""), ("c", &[], "")]);
        let mut s = scheduler(
            &p,
            Rules {
                on_leak: OnLeak::Fail,
                ..rules(2)
            },
        );
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        let first = end(&mut s, 0, &leaked("GPU-0"), now);
        assert_eq!(first[0], Action::Stop(Stopping::GpuLeaked));
        let second = end(&mut s, 1, &leaked("GPU-1"), now);
        assert!(
            !second.iter().any(|a| matches!(a, Action::Stop(_))),
            "said once"
        );
        assert!(s.is_done());
        let (actions, verdict) = s.finish();
        assert_eq!(skipped(&actions)[0].1, FailureClass::GpuLeaked);
        assert_eq!(verdict, Verdict::Leaked);
    }

    #[test]
    fn on_leak_warn_lets_the_run_go_on_and_it_ends_succeeded_with_a_leak() {
        let p = plan("", &[("a", &[], ""), ("b", &["a"], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        let actions = end(&mut s, 0, &leaked("GPU-0"), now);
        assert_eq!(actions.len(), 1, "only the stage's end: {actions:?}");
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        end(&mut s, 1, &succeeded(), now);
        assert_eq!(s.finish().1, Verdict::SucceededLeaked);
    }

    #[test]
    fn a_cancel_before_the_start_starts_nothing_and_skips_every_stage_as_interrupted() {
        let p = plan("", &[("a", &[], ""), ("b", &["a"], "")]);
        let mut s = scheduler(&p, rules(2));
        let now = Instant::now();
        assert!(s.on(Event::Cancel(CancelLevel::None), now).is_empty());
        let actions = s.on(Event::Cancel(CancelLevel::Graceful), now);
        let graceful = Action::CancelStages(CancelLevel::Graceful);
        assert_eq!(actions, vec![Action::Stop(Stopping::Interrupted), graceful]);
        assert!(round(&mut s, &mut Gpus::new(0), now).0.is_empty());
        assert!(s.is_done());
        let (actions, verdict) = s.finish();
        let classes: Vec<_> = skipped(&actions)
            .into_iter()
            .map(|(i, c, _)| (i, c))
            .collect();
        assert_eq!(
            classes,
            vec![
                (0, FailureClass::Interrupted),
                (1, FailureClass::Interrupted)
            ]
        );
        assert_eq!(verdict, Verdict::Interrupted);
    }

    #[test]
    fn a_cancel_while_stages_run_is_passed_on_once_per_level_and_stops_retries() {
        let p = plan(
            "",
            &[("a", &[], "retries = 3"), ("b", &[], ""), ("c", &[], "")],
        );
        let mut s = scheduler(&p, rules(2));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 1]);
        let graceful = s.on(Event::Cancel(CancelLevel::Graceful), now);
        let stop = Action::Stop(Stopping::Interrupted);
        let pass_on = Action::CancelStages(CancelLevel::Graceful);
        assert_eq!(graceful, vec![stop, pass_on]);
        assert!(s.on(Event::Cancel(CancelLevel::Graceful), now).is_empty());
        let kill = s.on(Event::Cancel(CancelLevel::Kill), now);
        assert_eq!(
            kill,
            vec![Action::CancelStages(CancelLevel::Kill)],
            "stopping is said once"
        );
        // A stage that fails as it is stopped is not retried.
        let actions = end(&mut s, 0, &failed(Failure::Exit(1)), now);
        assert!(matches!(
            actions[0],
            Action::Finished { retry_in: None, .. }
        ));
        let actions = end(&mut s, 1, &result(Outcome::Cancelled), now);
        assert!(matches!(
            &actions[0],
            Action::Finished { status: StageStatus::Cancelled, error: Some(e), .. } if e == "stopped by a signal"
        ));
        assert!(round(&mut s, &mut gpus, now).0.is_empty());
        assert!(s.is_done());
        let (actions, verdict) = s.finish();
        assert_eq!(skipped(&actions)[0].0, 2);
        assert_eq!(verdict, Verdict::Interrupted);
    }

    #[test]
    fn a_stage_waiting_for_gpus_says_why_once_per_reason_and_starts_when_they_free() {
        let p = plan("", &[("a", &[], "gpus = 1")]);
        let mut s = scheduler(
            &p,
            Rules {
                machine_has_gpus: true,
                early_start: false,
                ..rules(1)
            },
        );
        let mut gpus = Gpus::new(1);
        gpus.busy = Some("GPU 0 is held by pid 7 (python3)".into());
        let now = Instant::now();
        let (started, actions) = round(&mut s, &mut gpus, now);
        assert!(started.is_empty());
        assert!(s.gpu_waiting());
        let waiting = Action::Waiting {
            stage: 0,
            why: "GPU 0 is held by pid 7 (python3)".into(),
        };
        assert_eq!(actions, vec![waiting]);
        // The same reason is not told again; a new one is.
        assert!(round(&mut s, &mut gpus, now).1.is_empty());
        gpus.busy = Some("GPU 0 is held by pid 8 (python3)".into());
        assert_eq!(round(&mut s, &mut gpus, now).1.len(), 1);
        assert!(!s.is_done(), "a waiting stage keeps the run going");
        gpus.busy = None;
        let (started, actions) = round(&mut s, &mut gpus, now);
        assert_eq!((started, actions), (vec![0], vec![]));
        assert!(!s.gpu_waiting());
    }

    #[test]
    fn a_stage_waiting_for_gpus_does_not_hold_back_the_stages_behind_it() {
        let p = plan("", &[("g", &[], "gpus = 2"), ("c", &[], "")]);
        let mut s = scheduler(
            &p,
            Rules {
                machine_has_gpus: true,
                early_start: false,
                ..rules(2)
            },
        );
        let mut gpus = Gpus::new(2);
        gpus.free.truncate(1);
        let (started, _) = round(&mut s, &mut gpus, Instant::now());
        assert_eq!(started, vec![1]);
    }

    #[test]
    fn a_stage_that_needs_more_gpus_than_remain_usable_fails_and_skips_its_downstream() {
        let p = plan("", &[("a", &[], "gpus = 2"), ("b", &["a"], "")]);
        let mut s = scheduler(
            &p,
            Rules {
                machine_has_gpus: true,
                early_start: false,
                ..rules(1)
            },
        );
        let mut gpus = Gpus::new(2);
        gpus.total = 1; // one quarantined
        let (started, actions) = round(&mut s, &mut gpus, Instant::now());
        assert!(started.is_empty());
        let Action::Finished {
            stage: 0,
            attempt: 0,
            status: StageStatus::Failed,
            error: Some(error),
            failure: Some(FailureClass::NoGpu),
            runs_again: false,
            ..
        } = &actions[0]
        else {
            panic!("{actions:?}");
        };
        assert!(
            error.starts_with("needs 2 GPU(s) but only 1 are usable"),
            "{error}"
        );
        assert_eq!(skipped(&actions).len(), 1);
        assert!(s.is_done());
    }

    #[test]
    fn gpus_are_ignored_on_a_machine_without_them() {
        let p = plan("", &[("a", &[], "gpus = 4")]);
        let mut s = scheduler(&p, rules(1));
        assert_eq!(round(&mut s, &mut Gpus::new(0), Instant::now()).0, vec![0]);
    }

    #[test]
    fn an_attempt_that_cannot_be_prepared_gives_its_slot_back_and_fails() {
        let p = plan(
            "",
            &[("a", &[], "retries = 3"), ("b", &["a"], ""), ("c", &[], "")],
        );
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        let actions = s.on(
            Event::StartFailed {
                stage: 0,
                class: FailureClass::BadInput,
                message: "an input changed".into(),
            },
            now,
        );
        assert!(matches!(
            actions[0],
            Action::Finished { retry_in: None, .. }
        ));
        assert_eq!(skipped(&actions).len(), 1);
        assert_eq!(s.slots_held(), 0);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![2]);
    }

    #[test]
    fn a_stage_handed_a_slot_is_recorded_first_even_while_the_run_stops() {
        let p = plan("", &[("a", &[], ""), ("b", &[], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        assert_eq!(s.handover_candidate(), Some((0, 1, handover::Kind::Slot)));
        s.on(Event::HandedOver { from: 0, to: 1 }, now);
        s.on(Event::Cancel(CancelLevel::Graceful), now);
        s.begin_round(now);
        let mut actions = Vec::new();
        assert_eq!(
            s.next_start(&mut gpus, &mut actions),
            Some(Start::HandedOver(1))
        );
        assert_eq!(s.next_start(&mut gpus, &mut actions), None);
        assert_eq!(s.states()[1].attempts, 1);
    }

    #[test]
    fn a_chain_successor_started_by_its_upstream_is_not_started_again() {
        let p = plan("", &[("a", &[], ""), ("b", &["a"], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        assert_eq!(s.handover_candidate(), Some((0, 1, handover::Kind::Chain)));
        let r = succeeded();
        s.on(
            Event::AttemptEnded {
                stage: 0,
                result: &r,
                chained: Some(1),
            },
            now,
        );
        let (started, _) = round(&mut s, &mut gpus, now);
        assert_eq!(started, vec![1]);
        assert_eq!(s.states()[1].attempts, 1, "started once");
        assert!(round(&mut s, &mut gpus, now).0.is_empty());
    }

    #[test]
    fn no_hand_over_with_fail_fast_or_beside_other_work() {
        let p = plan("", &[("a", &[], ""), ("b", &[], "")]);
        let mut s = scheduler(
            &p,
            Rules {
                fail_fast: true,
                ..rules(1)
            },
        );
        round(&mut s, &mut Gpus::new(0), Instant::now());
        assert_eq!(s.handover_candidate(), None);
        let mut s = scheduler(&p, rules(2));
        round(&mut s, &mut Gpus::new(0), Instant::now());
        assert_eq!(s.handover_candidate(), None, "two stages run");
    }

    #[test]
    fn a_planned_successor_is_offered_once_and_given_back_when_the_stage_before_it_ends() {
        let p = plan("", &[("a", &[], ""), ("b", &["a"], ""), ("c", &[], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        // c is ready: it takes a's slot.
        assert_eq!(s.handover_candidate(), Some((0, 2, handover::Kind::Slot)));
        s.successor_planned(0, 2, handover::Kind::Slot);
        assert_eq!(s.handover_candidate(), None, "one successor at a time");
        assert_eq!(s.next_up(), Some((0, 2, handover::Kind::Slot)));
        // a ends without handing over (it failed): what was prepared for c goes back first,
        // and c starts the ordinary way.
        let actions = end(&mut s, 0, &failed(Failure::Exit(1)), now);
        assert_eq!(actions[0], Action::AbandonSuccessor(0), "{actions:?}");
        assert_eq!(s.next_up(), None);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![2]);
        // No successor planned after c: its end gives nothing back.
        let actions = end(&mut s, 2, &succeeded(), now);
        assert!(
            !actions.contains(&Action::AbandonSuccessor(2)),
            "{actions:?}"
        );
    }

    #[test]
    fn a_successor_that_took_the_slot_is_no_longer_planned_and_its_end_gives_nothing_back() {
        let p = plan("", &[("a", &[], ""), ("b", &[], ""), ("c", &[], "")]);
        let mut s = scheduler(&p, rules(1));
        let mut gpus = Gpus::new(0);
        let now = Instant::now();
        round(&mut s, &mut gpus, now);
        s.successor_planned(0, 1, handover::Kind::Slot);
        s.on(Event::HandedOver { from: 0, to: 1 }, now);
        assert_eq!(s.next_up(), None);
        assert_eq!(s.handover_candidate(), None, "b is still to be recorded");
        let actions = end(&mut s, 0, &succeeded(), now);
        assert!(
            !actions.contains(&Action::AbandonSuccessor(0)),
            "{actions:?}"
        );
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        // b runs alone now, with c ready: c may be planned after b.
        assert_eq!(s.handover_candidate(), Some((1, 2, handover::Kind::Slot)));
    }

    #[test]
    fn built_in_cpu_stages_side_by_side_share_the_cores() {
        let text = "[[stage]]\nname = \"a\"\nkind = \"train\"\n[stage.params]\ndata = \"synthetic:sft\"\n\
                    [[stage]]\nname = \"b\"\nkind = \"train\"\n[stage.params]\ndata = \"synthetic:sft\"\n";
        let p = parse_plan_toml(text, "t.toml", Path::new("/")).unwrap();
        let mut s = scheduler(&p, rules(2));
        let mut gpus = Gpus::new(0);
        s.begin_round(Instant::now());
        let mut actions = Vec::new();
        let threads = |start: Option<Start>| match start {
            Some(Start::Fresh { cpu_threads, .. }) => cpu_threads,
            other => panic!("{other:?}"),
        };
        // The first shares with the one ready behind it, the second with the one running.
        assert_eq!(threads(s.next_start(&mut gpus, &mut actions)), Some(4));
        gpus.builtins = 1;
        assert_eq!(threads(s.next_start(&mut gpus, &mut actions)), Some(4));
    }

    #[test]
    fn a_stage_kept_by_a_resume_counts_as_succeeded_for_its_downstream() {
        let p = plan("", &[("a", &[], ""), ("b", &["a"], "")]);
        let mut states = vec![StageState::pending(1), StageState::pending(0)];
        states[0].status = Status::Succeeded;
        let mut s = Scheduler::new(&p, rules(1), states);
        assert_eq!(round(&mut s, &mut Gpus::new(0), Instant::now()).0, vec![1]);
    }

    #[test]
    fn paced_starts_go_at_the_buckets_rate_and_the_loop_wakes_for_the_next() {
        let names: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
        let stages: Vec<(&str, &[&str], &str)> =
            names.iter().map(|n| (n.as_str(), &[][..], "")).collect();
        let p = plan("", &stages);
        let mut s = scheduler(&p, rules(100));
        s.pace_starts(crate::slurm::pacing::TokenBucket::new(10, 5));
        let mut gpus = Gpus::new(0);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let (first, _) = round(&mut s, &mut gpus, t0);
        assert_eq!(first.len(), 5, "the burst: {first:?}");
        assert_eq!(s.next_wake(), Some(ms(100)), "woken for the next token");
        assert!(
            round(&mut s, &mut gpus, ms(50)).0.is_empty(),
            "no token yet"
        );
        assert_eq!(round(&mut s, &mut gpus, ms(100)).0.len(), 1);
        assert_eq!(round(&mut s, &mut gpus, ms(400)).0.len(), 3, "10 a second");
        // However long the pause, no more than the burst at once.
        assert_eq!(round(&mut s, &mut gpus, ms(60_000)).0.len(), 5);
        assert_eq!(s.slots_held(), 14, "within max_parallel, only paced");
        // Unpaced, the same plan starts all at once.
        let mut free = scheduler(&p, rules(100));
        assert_eq!(round(&mut free, &mut gpus, t0).0.len(), 30);
        assert_eq!(free.next_wake(), None);
    }
    /// Carries out `GiveBackGpus` on the mock's GPUs; the actions.
    fn give_back(gpus: &mut Gpus, actions: Vec<Action>) -> Vec<Action> {
        for a in &actions {
            if let Action::GiveBackGpus(stage) = a {
                gpus.give_back(*stage);
            }
        }
        actions
    }

    /// Ends stage `stage` as the run loop does: its GPUs back unless it released them.
    fn end_on_gpus(
        s: &mut Scheduler<'_>,
        gpus: &mut Gpus,
        stage: usize,
        r: &AttemptResult,
        now: Instant,
    ) -> Vec<Action> {
        if s.holds_gpus(stage) {
            gpus.give_back(stage);
        }
        end(s, stage, r, now)
    }

    fn gpu_rules(max_parallel: usize) -> Rules {
        Rules {
            machine_has_gpus: true,
            ..rules(max_parallel)
        }
    }

    #[test]
    fn a_released_gpu_goes_to_a_waiting_stage_while_the_releaser_keeps_its_slot() {
        let p = plan(
            "",
            &[
                ("a", &[], "gpus = 1"),
                ("b", &[], "gpus = 1"),
                ("c", &[], ""),
            ],
        );
        let mut s = scheduler(&p, gpu_rules(2));
        let mut gpus = Gpus::new(1);
        let now = Instant::now();
        // a takes the GPU, b waits for it; c takes the second slot.
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 2]);
        assert!(s.gpu_waiting());
        end(&mut s, 2, &succeeded(), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        let actions = give_back(&mut gpus, s.on(released(0), now));
        assert_eq!(actions, vec![Action::GiveBackGpus(0)]);
        assert!(!s.holds_gpus(0));
        // b starts on the GPU a released, before a's end; a still holds its slot.
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        assert_eq!(gpus.held.get(&1).map(|g| g[0].uuid.as_str()), Some("GPU-0"));
        assert_eq!(s.slots_held(), 2);
        assert!(!s.is_done());
        // a's end gives nothing back: the GPU is b's now.
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert!(
            gpus.free.is_empty(),
            "b's GPU was not given back by a's end"
        );
        assert_eq!(s.slots_held(), 1);
        assert_eq!(s.states()[0].status, Status::Succeeded);
        end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        assert_eq!(gpus.free.len(), 1);
        assert!(s.is_done());
    }

    #[test]
    fn a_release_counts_only_for_a_running_stage_on_gpus_and_only_once() {
        let p = plan(
            "",
            &[
                ("a", &[], "gpus = 1"),
                ("b", &[], "gpus = 1"),
                ("c", &[], ""),
            ],
        );
        let mut s = scheduler(&p, gpu_rules(3));
        let mut gpus = Gpus::new(1);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0, 2]);
        // A stage on the CPU has no GPU to give back; nothing changes.
        assert!(s.on(released(2), now).is_empty());
        assert!(s.holds_gpus(2));
        // A stage not running (b waits for its GPU) neither.
        assert!(s.on(released(1), now).is_empty());
        assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        assert!(s.gpu_waiting(), "b still waits: no release held");
        // a's release: once; a second one gives nothing back again.
        assert_eq!(
            give_back(&mut gpus, s.on(released(0), now)),
            vec![Action::GiveBackGpus(0)]
        );
        assert!(s.on(released(0), now).is_empty());
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        // After its end, a late release of a is ignored: b's GPU stays b's.
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert!(s.on(released(0), now).is_empty());
        assert!(s.holds_gpus(0) && gpus.free.is_empty());
    }

    #[test]
    fn a_stage_that_fails_after_releasing_is_retried_once_its_gpu_is_free_again() {
        let p = plan(
            "",
            &[("a", &[], "gpus = 1\nretries = 1"), ("b", &[], "gpus = 1")],
        );
        let mut s = scheduler(&p, gpu_rules(2));
        let mut gpus = Gpus::new(1);
        let now = Instant::now();
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        give_back(&mut gpus, s.on(released(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        // a exits 1 while persisting: it fails and is retried, but its GPU is b's.
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &failed(Failure::Exit(1)), now);
        let retry = actions.iter().find_map(|a| match a {
            Action::Finished {
                stage: 0, retry_in, ..
            } => *retry_in,
            _ => None,
        });
        let wait = retry.expect("a is retried");
        assert!(
            gpus.free.is_empty(),
            "a's failure did not give back b's GPU"
        );
        let later = now + wait;
        let (started, _) = round(&mut s, &mut gpus, later);
        assert!(
            started.is_empty() && s.gpu_waiting(),
            "the retry waits for b's GPU"
        );
        assert!(s.holds_gpus(0), "the retry's GPUs will be its own");
        end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), later);
        assert_eq!(round(&mut s, &mut gpus, later).0, vec![0]);
        assert_eq!(s.states()[0].attempts, 2);
    }

    /// Built-in train stages on one GPU each: `(name, upstream for init, retries)`.
    fn train_plan(stages: &[(&str, Option<&str>, u32)]) -> LoadedPlan {
        let mut text = String::from("[run]\n");
        for (name, init, retries) in stages {
            text.push_str(&format!(
                "[[stage]]\nname = \"{name}\"\nkind = \"train\"\ngpus = 1\nretries = {retries}\n"
            ));
            if let Some(up) = init {
                text.push_str(&format!("init = \"{up}\"\nafter = [\"{up}\"]\n"));
            }
        }
        parse_plan_toml(&text, "t.toml", Path::new("/")).expect("the test plan is valid")
    }

    fn early_rules(max_parallel: usize) -> Rules {
        Rules {
            early_start: true,
            ..gpu_rules(max_parallel)
        }
    }

    /// Stage `stage` released its GPUs and said its downstream stages may start.
    fn released_for_downstream(stage: usize) -> Event<'static> {
        Event::GpusReleased {
            stage,
            downstream_may_start: true,
        }
    }

    /// The next start of a round, launched as the run loop launches it.
    fn start_one(s: &mut Scheduler<'_>, gpus: &mut Gpus, now: Instant) -> Option<Start> {
        s.begin_round(now);
        let mut actions = Vec::new();
        let start = s.next_start(gpus, &mut actions)?;
        let (Start::Fresh { stage, .. } | Start::HandedOver(stage)) = start;
        let event = Event::Launched {
            stage,
            may_hand_over: false,
        };
        s.on(event, now);
        Some(start)
    }

    /// The error of the first `Finished` among `actions` that has one.
    fn finished_error(actions: &[Action]) -> Option<String> {
        actions.iter().find_map(|a| match a {
            Action::Finished { error, .. } => error.clone(),
            _ => None,
        })
    }

    fn finished_of(actions: &[Action]) -> Vec<(usize, StageStatus, Option<Duration>)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Finished {
                    stage,
                    status,
                    retry_in,
                    ..
                } => Some((*stage, *status, *retry_in)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_release_that_lets_downstream_start_starts_it_early_and_its_finish_waits_for_the_upstreams()
    {
        let p = train_plan(&[("a", None, 0), ("b", Some("a"), 0)]);
        let now = Instant::now();
        // Without the stage's word, or with early starts off, b waits for a's success.
        for (rules, event) in [
            (early_rules(2), released(0)),
            (gpu_rules(2), released_for_downstream(0)),
        ] {
            let mut s = scheduler(&p, rules);
            let mut gpus = Gpus::new(1);
            assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
            give_back(&mut gpus, s.on(event, now));
            assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        }
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        // b starts on the GPU a released, ahead of a, which still persists its outputs.
        match start_one(&mut s, &mut gpus, now) {
            Some(Start::Fresh {
                stage: 1,
                attempt: 1,
                gpus: given,
                being_written,
                ..
            }) => {
                assert_eq!(being_written, vec![0]);
                assert_eq!(given[0].uuid, "GPU-0");
            }
            other => panic!("b did not start early: {other:?}"),
        }
        // b ends first: its success is held, nothing is recorded.
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        assert!(finished_of(&actions).is_empty(), "{actions:?}");
        assert!(s.is_held(1) && !s.is_done());
        // a's success is recorded, then b's.
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert_eq!(
            finished_of(&actions),
            vec![
                (0, StageStatus::Succeeded, None),
                (1, StageStatus::Succeeded, None)
            ]
        );
        assert!(!s.is_held(1));
        assert_eq!(s.states()[1].status, Status::Succeeded);
        assert!(s.is_done());
        assert_eq!(s.finish().1, Verdict::Succeeded);
    }

    #[test]
    fn an_early_stage_still_running_when_its_upstream_succeeds_is_concluded_as_usual() {
        let p = train_plan(&[("a", None, 0), ("b", Some("a"), 0)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert_eq!(
            finished_of(&actions),
            vec![(0, StageStatus::Succeeded, None)]
        );
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        assert_eq!(
            finished_of(&actions),
            vec![(1, StageStatus::Succeeded, None)]
        );
        assert!(s.is_done());
    }

    #[test]
    fn an_upstream_failure_stops_the_early_stage_which_reruns_after_the_retry_uncharged() {
        let p = train_plan(&[("a", None, 1), ("b", Some("a"), 1)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        // a fails after its release: it is retried, and b is stopped.
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &failed(Failure::Exit(1)), now);
        let wait = match finished_of(&actions)[..] {
            [(0, StageStatus::Failed, Some(wait))] => wait,
            _ => panic!("a is not retried: {actions:?}"),
        };
        assert!(actions.contains(&Action::StopStage(1)), "{actions:?}");
        // b's end (stopped) is recorded as such, not counted, and b waits for a again.
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &result(Outcome::Cancelled), now);
        assert_eq!(
            finished_of(&actions),
            vec![(1, StageStatus::Cancelled, None)]
        );
        let error = finished_error(&actions);
        assert!(error.unwrap().contains("not counted"));
        assert_eq!(s.states()[1].status, Status::Pending);
        assert!(s.ready().next().is_none(), "b waits for a's retry");
        // a's retry succeeds (no early release this time): b starts again, its second attempt.
        let later = now + wait;
        assert_eq!(round(&mut s, &mut gpus, later).0, vec![0]);
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), later);
        match start_one(&mut s, &mut gpus, later) {
            Some(Start::Fresh {
                stage: 1,
                attempt: 2,
                being_written,
                ..
            }) => assert!(being_written.is_empty()),
            other => panic!("b did not start again: {other:?}"),
        }
        // Its one retry is still there: the stopped attempt did not spend it.
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &failed(Failure::Exit(1)), later);
        assert!(
            matches!(
                finished_of(&actions)[..],
                [(1, StageStatus::Failed, Some(_))]
            ),
            "b's retry was spent by the stopped attempt: {actions:?}"
        );
    }

    #[test]
    fn a_held_early_stage_is_void_when_its_upstream_fails_for_good_and_skipped_with_it() {
        let p = train_plan(&[("a", None, 0), ("b", Some("a"), 0), ("c", Some("b"), 0)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(3));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        // b releases too: c starts ahead of b, which is itself ahead of a.
        give_back(&mut gpus, s.on(released_for_downstream(1), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![2]);
        end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        end_on_gpus(&mut s, &mut gpus, 2, &succeeded(), now);
        assert!(s.is_held(1) && s.is_held(2));
        // a fails for good: b and c are void, recorded as stopped, and skipped.
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &failed(Failure::Exit(1)), now);
        assert_eq!(
            finished_of(&actions),
            vec![
                (0, StageStatus::Failed, None),
                (1, StageStatus::Cancelled, None),
                (2, StageStatus::Cancelled, None)
            ]
        );
        let skipped: Vec<usize> = skipped(&actions).into_iter().map(|(i, ..)| i).collect();
        assert_eq!(skipped, vec![1, 2]);
        assert!(!actions.iter().any(|a| matches!(a, Action::StopStage(_))));
        assert!(s.is_done());
        assert_eq!(s.finish().1, Verdict::Failed);
    }

    #[test]
    fn a_held_result_is_kept_until_its_end_is_concluded_then_given_back_to_record() {
        let p = train_plan(&[("a", None, 0), ("b", Some("a"), 0)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        assert!(s.started_early(1) && !s.started_early(0));
        let mut b = succeeded();
        b.wall = Duration::from_secs(7);
        end_on_gpus(&mut s, &mut gpus, 1, &b, now);
        assert!(!s.started_early(1), "its attempt ended");
        s.keep_result(1, Box::new(b));
        assert!(s.take_concluded().is_empty(), "b's end is held");
        let a = succeeded();
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &a, now);
        assert_eq!(finished_of(&actions)[1], (1, StageStatus::Succeeded, None));
        s.keep_result(0, Box::new(a));
        let concluded = s.take_concluded();
        assert_eq!(concluded.len(), 1);
        assert_eq!(concluded[0].0, 1);
        assert_eq!(
            concluded[0].1.wall,
            Duration::from_secs(7),
            "b's own result"
        );
        assert!(s.take_concluded().is_empty(), "given back once");
    }

    #[test]
    fn a_command_stage_downstream_does_not_start_early() {
        let text = "[run]\n[[stage]]\nname = \"a\"\nkind = \"train\"\ngpus = 1\n\
            [[stage]]\nname = \"b\"\ncommand = [\"true\"]\ngpus = 1\nafter = [\"a\"]\n";
        let p = parse_plan_toml(text, "t.toml", Path::new("/")).unwrap();
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, Vec::<usize>::new());
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
    }

    #[test]
    fn an_upstream_that_succeeds_without_its_promised_checkpoint_voids_the_early_stage() {
        let text = "[run]\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\ngpus = 1\n\
            [[stage]]\nname = \"b\"\nkind = \"train\"\ngpus = 1\ninit = \"a\"\nafter = [\"a\"]\n";
        let p = parse_plan_toml(text, "t.toml", Path::new("/")).unwrap();
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        round(&mut s, &mut gpus, now);
        // A command stage that opted in releases: b starts early.
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![1]);
        assert!(s.take_inits_succeeded().is_empty(), "a still runs");
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        assert_eq!(s.take_inits_succeeded(), vec![(1, 0)], "b's init succeeded");
        assert!(s.take_inits_succeeded().is_empty(), "given once");
        // It wrote no manifest (the run loop sees that): b is stopped, once.
        let missing = || Event::InputMissing {
            stage: 1,
            upstream: 0,
        };
        assert_eq!(s.on(missing(), now), vec![Action::StopStage(1)]);
        assert!(s.on(missing(), now).is_empty());
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &result(Outcome::Cancelled), now);
        assert_eq!(
            finished_of(&actions),
            vec![(1, StageStatus::Cancelled, None)]
        );
        let error = finished_error(&actions);
        assert!(error.unwrap().contains("without the checkpoint manifest"));
        // b starts again the ordinary way (its worker then says what is missing).
        match start_one(&mut s, &mut gpus, now) {
            Some(Start::Fresh {
                stage: 1,
                attempt: 2,
                being_written,
                ..
            }) => assert!(being_written.is_empty()),
            other => panic!("b did not start again: {other:?}"),
        }
    }

    #[test]
    fn a_launched_early_start_has_its_mark_cleared_right_after_its_success_is_recorded() {
        let p = train_plan(&[("a", None, 0), ("b", Some("a"), 0)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        assert!(matches!(
            start_one(&mut s, &mut gpus, now),
            Some(Start::Fresh { stage: 1, .. })
        ));
        end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), now);
        let at = |a: &Action| actions.iter().position(|x| x == a);
        let b_recorded = actions
            .iter()
            .position(|a| matches!(a, Action::Finished { stage: 1, .. }));
        assert_eq!(at(&Action::ClearEarlyMark(1)), b_recorded.map(|k| k + 1));
        assert_eq!(
            at(&Action::ClearEarlyMark(0)),
            None,
            "a did not start early"
        );
    }

    #[test]
    fn a_void_early_start_keeps_its_mark_until_a_later_attempt_succeeds() {
        let p = train_plan(&[("a", None, 1), ("b", Some("a"), 0)]);
        let now = Instant::now();
        let mut s = scheduler(&p, early_rules(2));
        let mut gpus = Gpus::new(1);
        assert_eq!(round(&mut s, &mut gpus, now).0, vec![0]);
        give_back(&mut gpus, s.on(released_for_downstream(0), now));
        start_one(&mut s, &mut gpus, now).unwrap();
        // b ends first, a fails: b is void, its mark stays (the next start empties its output).
        end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), now);
        let actions = end_on_gpus(&mut s, &mut gpus, 0, &failed(Failure::Exit(1)), now);
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::ClearEarlyMark(_))),
            "{actions:?}"
        );
        assert!(
            actions.iter().any(|a| matches!(
                a,
                Action::Finished {
                    stage: 1,
                    status: StageStatus::Cancelled,
                    runs_again: true,
                    ..
                }
            )),
            "b is recorded as stopped and waits to run again: {actions:?}"
        );
        // a's retry succeeds, then b's ordinary attempt: its success clears the mark.
        let later = now + Duration::from_secs(60);
        assert_eq!(round(&mut s, &mut gpus, later).0, vec![0]);
        end_on_gpus(&mut s, &mut gpus, 0, &succeeded(), later);
        assert_eq!(round(&mut s, &mut gpus, later).0, vec![1]);
        let actions = end_on_gpus(&mut s, &mut gpus, 1, &succeeded(), later);
        assert!(actions.contains(&Action::ClearEarlyMark(1)), "{actions:?}");
    }

    #[test]
    fn restarts_that_get_no_further_are_counted_and_progress_resets_the_count() {
        let mut p = (None, 0);
        note_progress(&mut p, None);
        assert_eq!(p, (None, 0), "a stage that reports no step is not judged");
        note_progress(&mut p, Some(100));
        assert_eq!(p, (Some(100), 0));
        note_progress(&mut p, Some(100));
        note_progress(&mut p, None);
        assert_eq!(p, (Some(100), 2));
        note_progress(&mut p, Some(150));
        assert_eq!(p, (Some(150), 0));
    }

    #[test]
    fn retry_on_retries_a_lost_attempt_and_not_another_failure() {
        let retry = |r: &AttemptResult| {
            let p = plan("", &[("a", &[], "retries = 2\nretry_on = [\"lost\"]")]);
            let mut s = scheduler(&p, rules(1));
            let mut gpus = Gpus::new(0);
            let t0 = Instant::now();
            round(&mut s, &mut gpus, t0);
            match end(&mut s, 0, r, t0)[0] {
                Action::Finished { retry_in, .. } => retry_in.is_some(),
                _ => panic!("finished"),
            }
        };
        let mut lost = failed(Failure::Signal("SIGKILL".into()));
        assert!(!retry(&lost), "a failure retry_on does not name");
        lost.lost_on = Some("n2".into());
        assert!(retry(&lost), "an attempt lost with its node");
    }
}

//! One attempt of one stage, from spawn to verdict.
//!
//! An attempt is started by [`crate::attempt::launch::start_attempt`] and seen to its end by
//! [`supervise`]. Promises of [`supervise`]: when it returns, no process of the attempt is alive;
//! the GPUs it used have a reclaim verdict (when the check runs); the outputs of a successful
//! attempt are verified and checksummed; a failed attempt has a [`Failure`] that names what
//! happened.

use crate::attempt::channel::{ChannelItem, EventChannel};
use crate::attempt::launch::{AttemptPlan, CancelLevel, Launched, Services, TREE_SAMPLE_PERIOD};
use crate::attempt::outcome::{AttemptResult, Failure, Outcome};
use crate::events::{Events, Progress};
use crate::gpu::await_reclaim;
use crate::gpu::release::GpuBaseline;
use crate::process::reaper::{ExitStatus, ResourceUsage};
use crate::process::tree::{self as tree, StoppedProcess};
use nix::sys::signal::Signal;
use protocol::daemon::RunEventKind;
use protocol::report::{CheckpointRecord, GpuRecord, GpuVerdict};
use protocol::worker::{WorkerEvent, EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// SIGTERM to the attempt's tree, or to its first process only when the plan says so.
fn graceful_stop(plan: &AttemptPlan, child: &tree::StageProcess) {
    if plan.graceful_to_leader {
        child.signal_leader(Signal::SIGTERM);
    } else {
        child.signal(Signal::SIGTERM);
    }
}

/// The run's side of an attempt's hand-over points (see `crate::attempt::handover`).
pub trait AttemptHooks {
    /// Called as soon as the first process has exited with status 0 and no process of the
    /// stage is left, before the outputs are verified (the caller may start another stage
    /// then). True when the caller has a stage to start: [`supervise`] then yields once right
    /// after, so that the caller can start it.
    fn tree_gone(&mut self) -> bool;
    /// Called as soon as the attempt is known to have succeeded (its outputs verified), before
    /// its result is put together.
    fn succeeded(&mut self);
    /// Called once, when the stage released its GPUs and the release held (see
    /// [`crate::gpu::release`]): its GPUs' verdicts are taken, and the caller may give them to
    /// another stage while this one's processes still run. `downstream_may_start`: a
    /// `released` event said the stage writes its outputs the checkpoint way (manifest last),
    /// so its downstream stages may start early.
    fn gpus_released(&mut self, downstream_may_start: bool) {
        let _ = downstream_may_start;
    }
    /// Whether the caller can give the stage's GPUs to another stage at a release (not, say,
    /// for a stage whose GPUs are on another node): when false, releases are not looked at.
    fn hands_on_at_release(&self) -> bool {
        false
    }
}

/// Why an attempt is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopWhy {
    /// It ran past its timeout.
    TimedOut,
    /// The run was cancelled.
    Cancelled,
    /// It ran past its timeout, and the run was then cancelled with a kill.
    TimedOutThenCancelled,
    /// It made no progress for its stall window ([`Watch::hung`] says what it was doing).
    Hung,
    /// One of its ranks exited non-zero and the others were still running after the
    /// `rank_grace`.
    RankFailed,
}

/// How far the stopping of an attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopState {
    /// Nobody asked it to stop.
    Running,
    /// SIGTERM went out (to the tree, or to the leader); SIGKILL is due at `kill_at`.
    Terminating {
        why: StopWhy,
        kill_at: tokio::time::Instant,
    },
    /// SIGKILL went to the whole tree.
    Killed { why: StopWhy },
}

impl StopState {
    fn why(self) -> Option<StopWhy> {
        match self {
            StopState::Running => None,
            StopState::Terminating { why, .. } | StopState::Killed { why } => Some(why),
        }
    }

    /// Whether it ran past its timeout.
    fn timed_out(self) -> bool {
        matches!(
            self.why(),
            Some(StopWhy::TimedOut | StopWhy::TimedOutThenCancelled)
        )
    }

    /// Whether a cancel stopped it.
    fn cancelled(self) -> bool {
        matches!(
            self.why(),
            Some(StopWhy::Cancelled | StopWhy::TimedOutThenCancelled)
        )
    }

    /// The state after a kill that a cancel asked for.
    fn killed_by_cancel(self) -> StopState {
        let why = match self.why() {
            None | Some(StopWhy::Cancelled) => StopWhy::Cancelled,
            Some(_) => StopWhy::TimedOutThenCancelled,
        };
        StopState::Killed { why }
    }
}

/// An attempt being watched: what it has said, how far its stop went, its memory.
struct Watch {
    stop: StopState,
    events: EventState,
    /// The highest resident memory of the stage's tree, sampled.
    tree_rss_peak: u64,
    /// What came of its `released` events.
    release: Release,
    /// Its progress, as far as a hang is concerned.
    stall: crate::attempt::stall::StallWatch,
    /// Why it was judged hung, once it was.
    hung: Option<String>,
    /// A stage sharing its GPU (`gpu_memory`): what its own processes held there.
    shares: Vec<crate::gpu::shared::ShareWatch>,
    /// Its ranks, and whether one of them failed.
    ranks: crate::attempt::ranks::RankWatch,
    /// When the rest of the stage is stopped, after a rank failed.
    rank_stop_at: Option<tokio::time::Instant>,
}

impl Watch {
    /// Takes in one item of the stage's event channel, whether it came while the stage ran
    /// or was read after its exit: what it says of progress (the attempt's last step, which
    /// decides whether a retry got further) and what the run's readers are told.
    fn take_in(&mut self, item: ChannelItem, stage: &str, events: &Events, started: Instant) {
        if let ChannelItem::Event(event) = &item {
            self.stall.event(event, std::time::Instant::now());
        }
        self.events.absorb(item, stage, events, started);
    }
}

/// What came of a stage's `released` events.
#[derive(Debug, Default)]
struct Release {
    /// The release that held: when (Unix seconds), and its GPUs' verdicts then.
    held: Option<(f64, Vec<GpuRecord>)>,
    /// Why releases did not hold (the first few).
    refused: Vec<String>,
    /// After the release held: a process of the stage listed on one of its GPUs again.
    touched: Option<(String, crate::gpu::Holder)>,
}

/// Whether this attempt's GPUs may still be handed on at a release: it has GPUs to check, runs
/// (is not being stopped), has not released them yet, and both the run and this process hand
/// on at release.
fn may_hand_on(
    baselines: &[GpuBaseline],
    w: &Watch,
    hooks: &dyn AttemptHooks,
    services: &Services,
) -> bool {
    !baselines.is_empty()
        && w.stop == StopState::Running
        && w.release.held.is_none()
        && hooks.hands_on_at_release()
        && services.hand_on_at_release
}

/// Refusals of a stage's releases kept for its report.
const LISTED_REFUSALS: usize = 4;

/// Supervises a launched attempt to its end, in phases: watch it until its first process
/// exits (`watch`); stop and reap the rest of its tree (`reap_tree`), telling `hooks`
/// when a clean tree is gone; drain its channel; the GPU verdicts (`gpu_verdicts`); and its
/// outcome and result (`conclude`). See the module promises.
///
/// `launched` comes boxed and is taken apart at the first poll: an argument of an `async fn`
/// keeps its own place in the future beside the locals it is moved into, so a kilobyte given
/// by value would make every state of this future (moved whole as its task starts) a
/// kilobyte larger.
pub async fn supervise(
    launched: Box<Launched>,
    services: &Services,
    mut cancel: watch::Receiver<CancelLevel>,
    hooks: &mut dyn AttemptHooks,
) -> AttemptResult {
    let Launched {
        plan,
        mut child,
        copiers,
        spawned_unix,
        mut channel,
        mut baselines,
        stderr_offset,
        // Held to the verdict, at this function's end: the GPU's MPS daemon stays meanwhile.
        mps: _mps_client,
    } = *launched;
    let plan = &plan;
    let events = &services.events;
    let mut watched = Watch {
        stop: StopState::Running,
        events: EventState::default(),
        tree_rss_peak: 0,
        release: Release::default(),
        stall: crate::attempt::stall::StallWatch::new(plan.stall, std::time::Instant::now()),
        hung: None,
        shares: share_watches(plan, &baselines),
        ranks: Default::default(),
        rank_stop_at: None,
    };
    let reaped = watch(
        plan,
        &mut child,
        &mut channel,
        &mut baselines,
        &mut watched,
        &mut cancel,
        services,
        hooks,
    )
    .await;
    let exited_unix = crate::timefmt::unix_secs_f64();
    // A process of the stage that used a released GPU again and still holds it as the stage's
    // first process exits (the sampling during the stage sees the earlier ones).
    note_touched_again(&child, &mut watched.release, services);
    if let Some(probe) = &services.probe {
        let is_stage = |pid: u32| child.owns(pid as i32);
        for share in &mut watched.shares {
            share.main_exited(probe.as_ref(), child.pid as u32, &is_stage);
        }
    }
    let exit = reaped.map(|r| r.status);
    let summary = reap_tree(plan, &child, watched.stop, services).await;
    let wall = child.started.elapsed();
    let clean = exit == Some(ExitStatus::Code(0)) && watched.stop == StopState::Running;
    if clean && summary.found.is_empty() && summary.survivors.is_empty() && hooks.tree_gone() {
        tokio::task::yield_now().await;
    }
    let tree_gone_unix = crate::timefmt::unix_secs_f64();
    channel.drained(Duration::from_secs(1)).await;
    while let Some(item) = channel.try_next() {
        watched.take_in(item, &plan.name, events, child.started);
    }
    drop(channel);
    let window = crate::attempt::gpu_faults::Window {
        spawned: spawned_unix,
        exited: exited_unix,
        failed: !clean,
    };
    let gpu = gpu_verdicts(plan, &baselines, &watched, window, services).await;
    let verified_unix = crate::timefmt::unix_secs_f64();
    // With --follow, the log files are complete once the copiers have seen end of file, which
    // they do now that no process of the stage holds the pipes.
    for copier in copiers {
        let _ = tokio::time::timeout(Duration::from_secs(2), copier).await;
    }
    let usage: ResourceUsage = reaped.map(|r| r.usage).unwrap_or_default();
    let cgroup = summary.cgroup.unwrap_or_default();
    let isolation = match child.cgroup.is_some() {
        true => protocol::report::Isolation::Cgroup,
        false => protocol::report::Isolation::ProcessGroup,
    };
    let ended = Ended {
        exit,
        wall,
        gpu,
        leftovers: summary.found,
        stderr_offset,
        host: protocol::report::HostUsage {
            cpu_user_s: usage.user_s,
            cpu_system_s: usage.system_s,
            peak_rss_bytes: watched
                .tree_rss_peak
                .max(usage.max_rss_bytes)
                .max(cgroup.memory_peak.unwrap_or(0)),
            isolation: Some(isolation),
            // Without `memory.peak` (before Linux 5.19): the highest `memory.current` sampled.
            memory_peak_bytes: cgroup
                .memory_peak
                .or(cgroup.oom_kills.is_some().then_some(watched.tree_rss_peak)),
            memory_limit_bytes: cgroup.memory_limit,
            oom_kills: cgroup.oom_kills,
            pids_refused: cgroup.pids_refused,
        },
        timing: protocol::report::StageTiming {
            spawned: spawned_unix,
            exited: exited_unix,
            tree_gone: tree_gone_unix,
            verified: verified_unix,
            released: watched.release.held.as_ref().map(|(at, _)| *at),
        },
        start: crate::process::zygote::after_exit(child.start.take(), &plan.stage_dir),
    };
    let result = conclude(plan, &mut watched, ended, &mut cancel, hooks).await;
    // What the result did not take (its ranks' exit records among it) goes now, as before the
    // report below.
    drop(watched);
    if let Outcome::Failed(Failure::OomKilled { kills, peak, limit }) = &result.outcome {
        events.report(RunEventKind::StageOomKilled {
            stage: plan.name.clone(),
            attempt: plan.attempt,
            oom_kills: *kills,
            peak_bytes: *peak,
            limit_bytes: *limit,
        });
    }
    result
}

/// Watches the attempt until its first process exits: samples its tree's memory and its
/// GPUs' peaks, takes in its events, and stops it on its timeout or a cancel (SIGTERM, then
/// SIGKILL after the grace); checks a release the stage announces, and tells `hooks` when it
/// holds. `None`: the exit status was lost.
#[allow(clippy::too_many_arguments)]
async fn watch(
    plan: &AttemptPlan,
    child: &mut tree::StageProcess,
    channel: &mut EventChannel,
    baselines: &mut [GpuBaseline],
    w: &mut Watch,
    cancel: &mut watch::Receiver<CancelLevel>,
    services: &Services,
    hooks: &mut dyn AttemptHooks,
) -> Option<crate::process::reaper::Reaped> {
    let events = &services.events;
    let probe = services.probe.clone();
    let started = child.started;
    let timeout_at = plan
        .timeout
        .map(|t| tokio::time::Instant::from_std(started + t));
    let mut cancel_closed = false;
    let mut sampler = tokio::time::interval(Duration::from_millis(50));
    let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
    let stall_period = plan.stall.period();
    let stall_every = stall_period.unwrap_or(Duration::from_secs(3600));
    // A stage judged by what it shows is looked at once at its start (that look is what later
    // ones compare with). Any other stage is first looked at a period after its start: at its
    // start it cannot be hung, and a timer due at once has the runtime woken through its
    // eventfd, two system calls at every stage's start.
    let mut stall_tick = match w.stall.wants_activity() {
        true => tokio::time::interval(stall_every),
        false => tokio::time::interval_at(tokio::time::Instant::now() + stall_every, stall_every),
    };
    let mut rank_tick = tokio::time::interval(crate::attempt::ranks::LOOK_PERIOD);
    rank_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples = 0u32;
    loop {
        let kill_at = match w.stop {
            StopState::Terminating { kill_at, .. } => Some(kill_at),
            _ => None,
        };
        let running = w.stop == StopState::Running;
        let timing_out = timeout_at.is_some() && running;
        tokio::select! {
            reaped = &mut child.exit => return reaped,
            // A stage is first sampled a whole period after it started, as it was with a
            // timer of its own: a sweep's short stages never scan `/proc` for it.
            _ = services.tree_sampling.next() => if started.elapsed() >= TREE_SAMPLE_PERIOD {
                if child.start.is_some() {
                    // A stage with `preload`: its zygote may have become ready meanwhile.
                    services.forkers.zygotes.standbys_when_ready();
                }
                w.tree_rss_peak = w.tree_rss_peak.max(child.resident_bytes());
                samples += 1;
                // Ranks are looked for once a second (a launcher starts them once).
                if running && samples % 4 == 1 {
                    w.ranks.discover(child.pid, child.members().into_iter().map(|p| p.pid));
                }
            },
            _ = rank_tick.tick(), if running && w.ranks.watching() => {
                if let Some(failed) = w.ranks.look() {
                    let grace = protocol::duration::HumanDuration(plan.rank_grace);
                    events.warn(&format!(
                        "{}: {}; the other ranks are stopped if they still run in {grace}",
                        plan.name,
                        failed.describe()
                    ));
                    w.rank_stop_at = Some(tokio::time::Instant::now() + plan.rank_grace);
                }
            }
            _ = tokio::time::sleep_until(w.rank_stop_at.unwrap_or(far)), if running && w.rank_stop_at.is_some() => {
                events.warn(&format!("{}: stopping the other ranks", plan.name));
                w.stop = terminate(plan, child, StopWhy::RankFailed);
            }
            item = channel.next() => w.take_in(item, &plan.name, events, started),
            _ = stall_tick.tick(), if running && stall_period.is_some() => {
                if let Some(window) = look_for_a_hang(plan, child, w) {
                    w.stop = stop_hung(plan, child, w, services, window).await;
                }
            }
            _ = tokio::time::sleep_until(timeout_at.unwrap_or(far)), if timing_out => {
                // A process that ended before the timeout was looked at finished in time,
                // even if its exit was not collected yet (orchestrate itself was stopped, or
                // the runtime saw the exit and the timer at once and picked the timer).
                if let Some(reaped) = child.exit.try_wait() {
                    return reaped;
                }
                let after = protocol::duration::HumanDuration(plan.timeout.unwrap_or_default());
                events.warn(&format!("{}: timed out after {after}; stopping it", plan.name));
                w.stop = terminate(plan, child, StopWhy::TimedOut);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() => {
                child.signal(Signal::SIGKILL);
                w.stop = StopState::Killed { why: w.stop.why().unwrap_or(StopWhy::Cancelled) };
            }
            changed = cancel.changed(), if !cancel_closed => {
                if changed.is_err() {
                    cancel_closed = true;
                    continue;
                }
                let level = *cancel.borrow();
                match level {
                    CancelLevel::None => {}
                    CancelLevel::Graceful if running => {
                        w.stop = terminate(plan, child, StopWhy::Cancelled);
                    }
                    CancelLevel::Graceful => {}
                    CancelLevel::Kill => {
                        child.signal(Signal::SIGKILL);
                        w.stop = w.stop.killed_by_cancel();
                    }
                }
            }
            _ = sampler.tick(), if probe.is_some() && !baselines.is_empty() => {
                if w.release.held.is_some() {
                    // The GPUs are another stage's now: only a process of this one back on them
                    // is this stage's business.
                    note_touched_again(child, &mut w.release, services);
                } else if let Some(probe) = &probe {
                    let is_stage = |pid: u32| child.owns(pid as i32);
                    for share in &mut w.shares {
                        share.sample(probe.as_ref(), &is_stage);
                    }
                    for gpu in baselines.iter_mut() {
                        if let Ok(used) = probe.used_bytes(&gpu.uuid) {
                            gpu.peak = gpu.peak.max(used);
                        }
                    }
                }
            }
        }
        if std::mem::take(&mut w.events.finishing_asked) {
            prepare_successor(child, baselines, w, hooks, services);
        }
        if std::mem::take(&mut w.events.release_asked) {
            consider_release(plan, child, baselines, w, services, hooks).await;
        }
    }
}

/// Samples what a stage that reports no progress shows, when its rule judges it by that; the
/// window it has gone without progress, if it is hung now.
fn look_for_a_hang(
    plan: &AttemptPlan,
    child: &tree::StageProcess,
    w: &mut Watch,
) -> Option<Duration> {
    let now = std::time::Instant::now();
    if w.stall.wants_activity() {
        let pids = child.members().into_iter().map(|p| p.pid);
        let seen = crate::attempt::stall::Activity {
            cpu_s: crate::attempt::hang_evidence::cpu_seconds(pids),
            written: crate::attempt::stall::written(&[&plan.stage_dir]),
        };
        w.stall.activity(seen, now);
    }
    w.stall.hung(now)
}

/// A hung stage: its evidence saved (stacks, processes, GPUs), said on the console with each
/// process's top frame, then the stop a timeout gets (SIGTERM, the grace, SIGKILL).
async fn stop_hung(
    plan: &AttemptPlan,
    child: &tree::StageProcess,
    w: &mut Watch,
    services: &Services,
    window: Duration,
) -> StopState {
    let console = &services.events;
    let members = child.members();
    let gpus: Vec<String> = plan.gpus.iter().map(|g| g.uuid.clone()).collect();
    let gpu_text = services
        .probe
        .as_ref()
        .filter(|_| !gpus.is_empty())
        .map(|probe| crate::attempt::hang_evidence::gpu_state(&gpus, probe.as_ref()));
    // The NCCL ranks dump their flight recorders first, while nothing pauses them.
    let (asked, dumped) = crate::attempt::flight_recorder::request_dumps(
        &plan.stage_dir,
        plan.attempt,
        &plan.stage_dir.join(format!("hung-{}", plan.attempt)),
    )
    .await;
    let evidence = crate::attempt::hang_evidence::collect(
        &services.reaper,
        &plan.stage_dir,
        plan.attempt,
        &members,
        plan.argv.first().map(String::as_str),
        gpu_text,
    )
    .await;
    let step = w
        .stall
        .last_step()
        .map(|s| format!(" (last step {s})"))
        .unwrap_or_default();
    let mut what = format!(
        "no progress for {}{step}; evidence in {}",
        protocol::duration::HumanDuration(window),
        evidence.dir.display()
    );
    if let Some(why) = &evidence.no_stacks {
        what.push_str(&format!(" (no stacks: {why})"));
    }
    if asked > 0 {
        what.push_str(&format!(
            "; NCCL flight recorder: {dumped} of {asked} rank(s) dumped"
        ));
    }
    if let Some(top) = evidence.frames.first() {
        what.push_str(&format!("; {top}"));
    }
    console.warn(&format!("{}: hung: {what}; stopping it", plan.name));
    if !evidence.frames.is_empty() {
        let frames: String = evidence
            .frames
            .iter()
            .take(16)
            .map(|f| format!("  {f}\n"))
            .collect();
        console.detail(&format!(
            "---- where {}'s processes were ----\n{frames}----\n",
            plan.name
        ));
    }
    w.hung = Some(what);
    terminate(plan, child, StopWhy::Hung)
}

/// The stage said its device work is about to end: where its GPUs may be handed on at its
/// release, the fork server gets a standby ready for the stage that takes them next
/// (`crate::process::forkers::Forkers::prepare_standby`).
fn prepare_successor(
    child: &tree::StageProcess,
    baselines: &[GpuBaseline],
    w: &Watch,
    hooks: &mut dyn AttemptHooks,
    services: &Services,
) {
    if may_hand_on(baselines, w, hooks, services) {
        services.forkers.prepare_standby(child.pid);
    }
}

/// The stage said it released its GPUs: if that holds on every one of them (no process of the
/// stage listed, the memory back at the baseline within the tolerance), their verdicts are
/// taken now and `hooks` hands them on; if not, nothing changes but the reason, kept for the
/// report. Only the first release that holds counts; a stopping stage's is not looked at.
async fn consider_release(
    plan: &AttemptPlan,
    child: &tree::StageProcess,
    baselines: &[GpuBaseline],
    w: &mut Watch,
    services: &Services,
    hooks: &mut dyn AttemptHooks,
) {
    let Some(probe) = &services.probe else {
        return;
    };
    if !may_hand_on(baselines, w, hooks, services) {
        return;
    }
    let ours = crate::process::guard::token_prefix(std::process::id()).into_bytes();
    let foreign = |pid| crate::gpu::attribution::owner_of(pid, &ours);
    let is_stage = |pid: u32| child.owns(pid as i32);
    let checked = crate::gpu::release::check_release(
        probe.as_ref(),
        baselines,
        services.tolerance_bytes,
        &is_stage,
        &foreign,
    )
    .await;
    match checked {
        Ok(records) => {
            let uuids: Vec<&str> = records.iter().map(|r| r.uuid.as_str()).collect();
            services.events.note(&format!(
                "{}: released {}; handed on while it finishes",
                plan.name,
                uuids.join(", ")
            ));
            w.release.held = Some((crate::timefmt::unix_secs_f64(), records));
            hooks.gpus_released(w.events.downstream_may_start);
        }
        Err(why) => {
            services.events.warn(&format!(
                "{}: its GPU release does not hold ({why}); its GPUs are handed on after it ends",
                plan.name
            ));
            if w.release.refused.len() < LISTED_REFUSALS {
                w.release.refused.push(why);
            }
        }
    }
}

/// After a release held: notes the first process of the stage that the probe lists on one of
/// its GPUs again.
fn note_touched_again(child: &tree::StageProcess, release: &mut Release, services: &Services) {
    let (Some(probe), Some((_, records))) = (&services.probe, &release.held) else {
        return;
    };
    if release.touched.is_some() {
        return;
    }
    let uuids: Vec<String> = records.iter().map(|r| r.uuid.clone()).collect();
    let is_stage = |pid: u32| child.owns(pid as i32);
    release.touched = crate::gpu::release::touched_again(probe.as_ref(), &uuids, &is_stage);
}

/// Asks the attempt to stop (SIGTERM), with SIGKILL due after its grace.
fn terminate(plan: &AttemptPlan, child: &tree::StageProcess, why: StopWhy) -> StopState {
    graceful_stop(plan, child);
    StopState::Terminating {
        why,
        kill_at: tokio::time::Instant::now() + plan.grace,
    }
}

/// The first process is gone: anything of its tree still alive is a leftover, stopped (at
/// once if the attempt was being stopped, else after its grace) and reaped.
async fn reap_tree(
    plan: &AttemptPlan,
    child: &tree::StageProcess,
    stop: StopState,
    services: &Services,
) -> tree::StopSummary {
    let events = &services.events;
    let stopping = stop != StopState::Running;
    let grace = if stopping { Duration::ZERO } else { plan.grace };
    let summary = child.stop(grace, &services.reaper).await;
    if !summary.found.is_empty() && !stopping {
        // A fork bomb's worth of pids on one line helps nobody: the first few, then a count
        // (the report lists every one).
        let mut list = summary
            .found
            .iter()
            .take(8)
            .map(|p| format!("pid {} ({})", p.pid, p.name))
            .collect::<Vec<_>>()
            .join(", ");
        if summary.found.len() > 8 {
            let more = summary.found.len() - 8;
            list.push_str(&format!(", and {more} more (see report.json)"));
        }
        events.warn(&format!(
            "{}: {} process(es) outlived the stage's main process and were stopped: {list}",
            plan.name,
            summary.found.len()
        ));
    }
    if !summary.survivors.is_empty() {
        events.warn(&format!(
            "{}: processes would not die even after SIGKILL: {:?}",
            plan.name, summary.survivors
        ));
    }
    summary
}

/// The GPU verdicts, now that every process of the stage is gone: each GPU's memory awaited
/// back to its baseline, and whose it is if it does not come back. A stage whose release held
/// has its verdicts from then (a leak if a process of it used a GPU again afterwards); one
/// whose releases were refused has the reason in its verdicts' notes.
async fn gpu_verdicts(
    plan: &AttemptPlan,
    baselines: &[GpuBaseline],
    watched: &Watch,
    window: crate::attempt::gpu_faults::Window,
    services: &Services,
) -> Vec<GpuRecord> {
    let Some(probe) = &services.probe else {
        return Vec::new();
    };
    let release = &watched.release;
    let mut records = match &release.held {
        None if !watched.shares.is_empty() => {
            let mut records = Vec::new();
            for share in &watched.shares {
                let (tolerance, timeout) = (services.tolerance_bytes, services.reclaim_timeout);
                let record =
                    crate::gpu::shared::await_shared(probe.as_ref(), share, tolerance, timeout)
                        .await;
                if share.peak > share.declared {
                    services.events.warn(&format!(
                        "{}: used {} MiB of GPU memory, more than the {} MiB it declared (gpu_memory)",
                        plan.name,
                        share.peak >> 20,
                        share.declared >> 20
                    ));
                }
                records.push(record);
            }
            records
        }
        Some((_, held)) => after_release(held, release.touched.as_ref()),
        None => {
            let mut records = awaited(probe.as_ref(), baselines, services).await;
            if let Some(why) = release.refused.first() {
                for r in &mut records {
                    let refused = format!("the GPUs were not handed on at release: {why}");
                    r.note = Some(match r.note.take() {
                        Some(note) => format!("{note}; {refused}"),
                        None => refused,
                    });
                }
            }
            records
        }
    };
    crate::attempt::gpu_faults::attach(plan, probe.as_ref(), &mut records, window, services).await;
    for record in records.iter().filter(|r| r.verdict != GpuVerdict::Clean) {
        services.events.report(RunEventKind::GpuNotReclaimed {
            stage: plan.name.clone(),
            uuid: record.uuid.clone(),
            verdict: record.verdict,
            baseline_bytes: record.baseline_bytes,
            after_bytes: record.after_bytes,
            reclaim_ms: record.reclaim_ms,
            holders: record.holders.clone(),
            note: record.note.clone(),
        });
    }
    if !records.is_empty() {
        services.events.report(RunEventKind::StageGpu {
            stage: plan.name.clone(),
            attempt: plan.attempt,
            gpus: records.clone(),
        });
    }
    records
}

/// What a sharing stage's GPUs are watched for (none for a stage that has its GPUs whole).
fn share_watches(
    plan: &AttemptPlan,
    baselines: &[GpuBaseline],
) -> Vec<crate::gpu::shared::ShareWatch> {
    let Some(declared) = plan.gpu_share else {
        return Vec::new();
    };
    baselines
        .iter()
        .map(|b| crate::gpu::shared::ShareWatch {
            uuid: b.uuid.clone(),
            baseline: b.baseline,
            declared,
            peak: 0,
            pids: Vec::new(),
            others: Vec::new(),
            left_behind: None,
        })
        .collect()
}

/// The verdicts taken at a release that held; the GPU a process of the stage used again
/// afterwards is leaked.
fn after_release(
    held: &[GpuRecord],
    touched: Option<&(String, crate::gpu::Holder)>,
) -> Vec<GpuRecord> {
    let mut records = held.to_vec();
    if let Some((uuid, holder)) = touched {
        for r in records.iter_mut().filter(|r| &r.uuid == uuid) {
            r.verdict = GpuVerdict::Leaked;
            r.holders = vec![holder.to_string()];
            r.note = Some(format!(
                "{holder}, a process of the stage, used the GPU again after the stage released it"
            ));
        }
    }
    records
}

/// Each GPU's memory awaited back to its baseline after the stage, and the verdict.
async fn awaited(
    probe: &dyn crate::gpu::MemoryProbe,
    baselines: &[GpuBaseline],
    services: &Services,
) -> Vec<GpuRecord> {
    let ours = crate::process::guard::token_prefix(std::process::id()).into_bytes();
    let owner = |pid| crate::gpu::attribution::owner_of(pid, &ours);
    let mut records = Vec::new();
    for GpuBaseline {
        uuid,
        baseline,
        peak,
    } in baselines
    {
        let v = await_reclaim(
            probe,
            uuid,
            *baseline,
            services.tolerance_bytes,
            services.reclaim_timeout,
            &owner,
        )
        .await;
        records.push(v.record(*peak));
    }
    records
}

/// What is known of an attempt once its tree is gone and its GPUs judged.
struct Ended {
    exit: Option<ExitStatus>,
    wall: Duration,
    gpu: Vec<GpuRecord>,
    leftovers: Vec<StoppedProcess>,
    stderr_offset: u64,
    host: protocol::report::HostUsage,
    timing: protocol::report::StageTiming,
    start: Option<protocol::report::StageStart>,
}

/// The attempt's outcome (its outputs verified when it exited cleanly) and result.
/// `watched` is borrowed (what the result keeps of it is taken out): given by value, it would
/// be held twice in this future, as its argument and as its local.
async fn conclude(
    plan: &AttemptPlan,
    watched: &mut Watch,
    ended: Ended,
    cancel: &mut watch::Receiver<CancelLevel>,
    hooks: &mut dyn AttemptHooks,
) -> AttemptResult {
    // The tail serves failures (and their classification): a clean exit reads it only if
    // the attempt fails after all (its outputs do not verify).
    let stderr_path = plan.stage_dir.join("stderr.log");
    let clean_exit = ended.exit == Some(ExitStatus::Code(0));
    let mut stderr_tail = match clean_exit {
        true => String::new(),
        false => read_tail(&stderr_path, ended.stderr_offset),
    };
    let stop = watched.stop;
    let rank_failed = rank_failure(plan, watched, ended.exit, &stderr_tail);
    let mut outcome = match (watched.hung.take(), rank_failed) {
        (Some(what), _) => Outcome::Failed(Failure::Hung(what)),
        (None, Some(failure)) => Outcome::Failed(failure),
        (None, None) => classify(
            plan,
            ended.exit,
            &watched.events,
            stop.timed_out(),
            stop.cancelled(),
            matches!(stop, StopState::Killed { .. }),
            &stderr_tail,
        ),
    };
    outcome = host_oom(outcome, &ended.host);
    let mut checkpoints = Vec::new();
    if outcome == Outcome::Succeeded {
        let reported = std::mem::take(&mut watched.events.reported);
        match verify_outputs(plan, reported, cancel).await {
            Ok(records) => checkpoints = records,
            Err(stopped) => outcome = stopped,
        }
    }
    if outcome == Outcome::Succeeded {
        hooks.succeeded();
    }
    let failed = matches!(outcome, Outcome::Failed(_));
    if failed && clean_exit {
        stderr_tail = read_tail(&stderr_path, ended.stderr_offset);
    }
    let violations = watched.events.violations_listed();
    let last_step = watched.stall.last_step();
    AttemptResult {
        outcome,
        exit: ended.exit,
        wall: ended.wall,
        checkpoints,
        metrics: std::mem::take(&mut watched.events.metrics),
        gpu: ended.gpu,
        leftovers: ended.leftovers,
        violations,
        stderr_tail: failed.then_some(stderr_tail),
        host: Some(ended.host),
        timing: Some(ended.timing),
        start: ended.start,
        started_early: false,
        last_step,
        lost_on: None,
    }
}

/// A failed rank, when the attempt failed (did not exit 0) for no reason of orchestrate's
/// (a timeout, a cancel): the rank seen ending badly, else (or when the one seen was stopped
/// by a signal) the one `torchrun` names on stderr; with what came of the rest of the stage.
fn rank_failure(
    plan: &AttemptPlan,
    watched: &Watch,
    exit: Option<ExitStatus>,
    stderr_tail: &str,
) -> Option<Failure> {
    let stop = watched.stop;
    if exit == Some(ExitStatus::Code(0)) || stop.timed_out() || stop.cancelled() {
        return None;
    }
    // A rank seen stopped by a signal may be one torchrun stopped after the rank it names.
    let seen = watched.ranks.failed().cloned();
    let named = || crate::attempt::ranks::from_torchrun(stderr_tail);
    let rank = match seen {
        Some(seen) if crate::attempt::ranks::is_stop_signal(seen.status) => named().unwrap_or(seen),
        Some(seen) => seen,
        None => named()?,
    };
    let then = match (stop.why(), exit) {
        (Some(StopWhy::RankFailed), _) => format!(
            "the other ranks still ran after the rank_grace of {} and were stopped",
            protocol::duration::HumanDuration(plan.rank_grace)
        ),
        (_, Some(ExitStatus::Code(code))) => format!("the stage exited with code {code}"),
        (_, Some(ExitStatus::Signal(sig))) => {
            format!("the stage was killed by {}", tree::signal_name(sig))
        }
        (_, None) => "the stage's exit status was lost".into(),
    };
    Some(Failure::RankFailed { rank, then })
}

/// Protocol violations of one attempt listed one by one; the rest are counted.
const LISTED_VIOLATIONS: usize = 20;

/// What the stage said on its channel.
#[derive(Debug, Default)]
struct EventState {
    metrics: BTreeMap<String, f64>,
    failed: Option<(String, Option<String>)>,
    done: bool,
    /// The first [`LISTED_VIOLATIONS`] protocol violations, and how many came after them.
    violations: Vec<String>,
    unlisted_violations: u64,
    /// Files the stage reported writing, with the checksums it computed while writing.
    reported: Vec<crate::store::checksum::ReportedFile>,
    /// A `released` event came that was not looked at yet.
    release_asked: bool,
    /// A `released` event said its downstream stages may start early.
    downstream_may_start: bool,
    /// A `finishing` event came that was not looked at yet.
    finishing_asked: bool,
}

impl EventState {
    /// The violations as the report lists them: the first ones, then a count of the rest.
    fn violations_listed(&mut self) -> Vec<String> {
        let mut listed = std::mem::take(&mut self.violations);
        if self.unlisted_violations > 0 {
            listed.push(format!(
                "and {} more violation(s) of the event protocol, not listed",
                self.unlisted_violations
            ));
        }
        listed
    }

    fn absorb(&mut self, item: ChannelItem, stage: &str, events: &Events, started: Instant) {
        match item {
            ChannelItem::Event(WorkerEvent::Progress {
                step,
                total_steps,
                loss,
                tokens_per_s,
            }) => events.progress(Progress {
                stage: stage.to_string(),
                step,
                total: total_steps,
                loss,
                tokens_per_s,
                elapsed: started.elapsed(),
            }),
            ChannelItem::Event(WorkerEvent::Metrics { metrics }) => self.metrics.extend(metrics),
            ChannelItem::Event(WorkerEvent::Failed { error, reason }) => {
                self.failed = Some((error, reason))
            }
            ChannelItem::Event(WorkerEvent::Done {}) => self.done = true,
            ChannelItem::Event(WorkerEvent::Released {
                downstream_may_start,
                ..
            }) => {
                self.release_asked = true;
                self.downstream_may_start |= downstream_may_start;
            }
            ChannelItem::Event(WorkerEvent::Started { .. }) => {}
            ChannelItem::Event(WorkerEvent::Finishing {}) => self.finishing_asked = true,
            ChannelItem::Event(WorkerEvent::Checkpoint {
                path,
                step,
                sha256,
                blake3,
                bytes,
                identity,
            }) => {
                tracing::debug!(stage, path = %path.display(), ?step, "checkpoint reported");
                let checksum = protocol::checkpoint::Checksum::from_event(sha256, blake3);
                if let (Some(checksum), Some(bytes), Some(identity)) = (checksum, bytes, identity) {
                    if self.reported.len() < 10_000 {
                        self.reported.push(crate::store::checksum::ReportedFile {
                            checksum,
                            bytes,
                            identity,
                        });
                    }
                }
            }
            ChannelItem::Violation(why) => {
                if self.violations.len() < LISTED_VIOLATIONS {
                    events.warn(&format!("{stage}: ignored {why} on the event channel"));
                    self.violations.push(why);
                } else {
                    if self.unlisted_violations == 0 {
                        events.warn(&format!(
                            "{stage}: more violations on the event channel are counted, not listed"
                        ));
                    }
                    self.unlisted_violations += 1;
                }
            }
        }
    }
}

/// A failure during which the kernel's OOM killer ended processes of the stage's cgroup is
/// that (`oom_killed`): the SIGKILL, or the exit of a parent whose worker it killed, is its
/// consequence. A timeout or a cancel stays what it was.
fn host_oom(outcome: Outcome, host: &protocol::report::HostUsage) -> Outcome {
    match (outcome, host.oom_kills) {
        (Outcome::Failed(f), Some(kills)) if kills > 0 && !matches!(f, Failure::Timeout(_)) => {
            Outcome::Failed(Failure::OomKilled {
                kills,
                peak: host.memory_peak_bytes,
                limit: host.memory_limit_bytes,
            })
        }
        (outcome, _) => outcome,
    }
}

fn classify(
    plan: &AttemptPlan,
    exit: Option<ExitStatus>,
    state: &EventState,
    timed_out: bool,
    cancelled: bool,
    we_killed: bool,
    stderr_tail: &str,
) -> Outcome {
    if timed_out {
        return Outcome::Failed(Failure::Timeout(plan.timeout.unwrap_or_default()));
    }
    if cancelled {
        return Outcome::Cancelled;
    }
    let oom_in_stderr = stderr_tail.contains("CUDA out of memory")
        || stderr_tail.contains("CUDA error: out of memory")
        || stderr_tail.contains("OutOfMemoryError");
    match exit {
        None => Outcome::Failed(Failure::ProtocolViolation(
            "its exit status was lost".into(),
        )),
        Some(ExitStatus::Code(0)) => match &state.failed {
            Some((error, _)) => Outcome::Failed(Failure::ProtocolViolation(format!(
                "it reported failure ({error}) but exited 0"
            ))),
            None => Outcome::Succeeded,
        },
        Some(ExitStatus::Code(code)) => {
            let reason = state.failed.as_ref().and_then(|(_, r)| r.as_deref());
            let message = state.failed.as_ref().map(|(e, _)| e.clone());
            if reason == Some("cuda_oom")
                || code == EXIT_OUT_OF_MEMORY && plan.builtin
                || oom_in_stderr
            {
                Outcome::Failed(Failure::CudaOutOfMemory(
                    message.unwrap_or_else(|| "see the stage's stderr".into()),
                ))
            } else if reason == Some("bad_input") || code == EXIT_BAD_INPUT && plan.builtin {
                Outcome::Failed(Failure::BadInput(
                    message.unwrap_or_else(|| "see the stage's stderr".into()),
                ))
            } else if let Some(message) = message {
                Outcome::Failed(Failure::Reported(code, message))
            } else {
                Outcome::Failed(Failure::Exit(code))
            }
        }
        Some(ExitStatus::Signal(sig)) if sig == libc::SIGKILL && !we_killed => {
            Outcome::Failed(Failure::KilledExternally)
        }
        Some(ExitStatus::Signal(sig)) => Outcome::Failed(Failure::Signal(tree::signal_name(sig))),
    }
}

/// Whether a look at a path said it is not there (any other error is not taken for absence).
fn is_not_found<T>(looked: std::io::Result<T>) -> bool {
    matches!(looked, Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Verifies and records a finished attempt's outputs ([`crate::attempt::outputs::record`]) on a
/// blocking thread, while still answering `cancel`: a stop request raises the hashing's abort
/// flag, which ends it within a mebibyte, and the attempt is then cancelled.
async fn verify_outputs(
    plan: &AttemptPlan,
    reported: Vec<crate::store::checksum::ReportedFile>,
    cancel: &mut watch::Receiver<CancelLevel>,
) -> Result<Vec<CheckpointRecord>, Outcome> {
    use crate::attempt::outputs::OutputError;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let abort = Arc::new(AtomicBool::new(false));
    let manifest = plan.output_dir.join(protocol::checkpoint::MANIFEST_FILE);
    let verdict =
        if plan.declared_outputs.is_empty() && is_not_found(std::fs::symlink_metadata(&manifest)) {
            // Nothing to read: one failed look is cheaper than a trip to a blocking thread, and
            // the manifest seen missing is not looked for again.
            crate::attempt::outputs::record_without_manifest(&plan.output_dir, plan.builtin)
        } else {
            let dir = plan.output_dir.clone();
            let declared = plan.declared_outputs.clone();
            let builtin = plan.builtin;
            let left = plan.left_over.clone();
            let flag = abort.clone();
            let mut work = tokio::task::spawn_blocking(move || {
                crate::attempt::outputs::record(&dir, &declared, builtin, &reported, &left, &flag)
            });
            let mut cancel_open = true;
            loop {
                tokio::select! {
                    done = &mut work => break done.unwrap_or_else(|e| {
                        Err(OutputError::Refused(format!("verification panicked: {e}")))
                    }),
                    changed = cancel.changed(), if cancel_open => match changed {
                        Err(_) => cancel_open = false,
                        Ok(()) if *cancel.borrow() != CancelLevel::None => {
                            abort.store(true, Ordering::Relaxed)
                        }
                        Ok(()) => {}
                    },
                }
            }
        };
    verdict.map_err(|e| match e {
        OutputError::Missing(files) => Outcome::Failed(Failure::MissingOutputs(files)),
        OutputError::Refused(why) => Outcome::Failed(Failure::CorruptOutput(why)),
        OutputError::Interrupted => Outcome::Cancelled,
    })
}

/// The last 20 lines (at most 4 KiB) that the attempt wrote to `path` after `offset`.
/// The console's line for a GPU that did not come back clean: a leak, or memory someone else
/// took while the stage ran (who, how much, and that the next stage waits for it).
fn read_tail(path: &Path, offset: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = offset.max(len.saturating_sub(4096));
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> tokio::time::Instant {
        tokio::time::Instant::now()
    }

    #[test]
    fn a_failure_with_oom_kills_in_its_cgroup_is_oom_killed_and_not_retried() {
        let mut host = protocol::report::HostUsage {
            cpu_user_s: 0.0,
            cpu_system_s: 0.0,
            peak_rss_bytes: 0,
            isolation: Some(protocol::report::Isolation::Cgroup),
            memory_peak_bytes: Some(256 << 20),
            memory_limit_bytes: Some(256 << 20),
            oom_kills: Some(1),
            pids_refused: None,
        };
        let killed = host_oom(Outcome::Failed(Failure::KilledExternally), &host);
        let Outcome::Failed(failure) = killed else {
            panic!("still a failure");
        };
        assert_eq!(
            failure,
            Failure::OomKilled {
                kills: 1,
                peak: Some(256 << 20),
                limit: Some(256 << 20)
            }
        );
        assert_eq!(failure.class().as_str(), "oom_killed");
        assert!(
            failure.describe().contains("limit of 256MiB"),
            "{}",
            failure.describe()
        );
        assert!(!failure.retryable(false) && failure.retryable(true));
        // A parent that exited 1 because its worker was killed: the same verdict.
        let parent = host_oom(Outcome::Failed(Failure::Exit(1)), &host);
        assert!(matches!(parent, Outcome::Failed(Failure::OomKilled { .. })));
        // A timeout stays a timeout; success, and failures without kills, stay as they were.
        let timeout = Outcome::Failed(Failure::Timeout(Duration::from_secs(1)));
        assert_eq!(host_oom(timeout.clone(), &host), timeout);
        assert_eq!(host_oom(Outcome::Succeeded, &host), Outcome::Succeeded);
        host.oom_kills = Some(0);
        let exit = Outcome::Failed(Failure::Exit(1));
        assert_eq!(host_oom(exit.clone(), &host), exit);
    }

    #[test]
    fn a_stop_state_says_why_it_stopped() {
        assert!(!StopState::Running.timed_out() && !StopState::Running.cancelled());
        let timed_out = StopState::Terminating {
            why: StopWhy::TimedOut,
            kill_at: at(),
        };
        assert!(timed_out.timed_out() && !timed_out.cancelled());
        let cancelled = StopState::Killed {
            why: StopWhy::Cancelled,
        };
        assert!(cancelled.cancelled() && !cancelled.timed_out());
    }

    #[test]
    fn a_kill_asked_for_during_a_timeout_stop_keeps_the_timeout() {
        let timed_out = StopState::Terminating {
            why: StopWhy::TimedOut,
            kill_at: at(),
        };
        let killed = timed_out.killed_by_cancel();
        assert_eq!(
            killed,
            StopState::Killed {
                why: StopWhy::TimedOutThenCancelled
            }
        );
        assert!(killed.timed_out() && killed.cancelled());
        // A kill of a running stage, or of one a cancel was stopping, is a cancel.
        let cancelled = StopState::Killed {
            why: StopWhy::Cancelled,
        };
        assert_eq!(StopState::Running.killed_by_cancel(), cancelled);
        let terminating = StopState::Terminating {
            why: StopWhy::Cancelled,
            kill_at: at(),
        };
        assert_eq!(terminating.killed_by_cancel(), cancelled);
    }
}

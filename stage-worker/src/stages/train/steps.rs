//! The training loop: the steps, their progress events, the periodic checkpoints and a stop
//! on a signal; and the figures it gathers.

use super::earlier::training_state;
use crate::boot::signals;
use crate::checkpoint::{self, LossHistory, Verified};
use crate::data::batch::Sampler;
use crate::device::Compute;
use crate::events::EventSink;
use crate::failure::StageResult;
use crate::model::optim::{AdamW, Schedule};
use crate::model::ByteGpt;
use crate::stages::progress::ProgressClock;
use protocol::worker::TrainParams;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;
use tch::Tensor;

/// `final_loss` is the mean loss of this many last steps.
const FINAL_LOSS_STEPS: usize = 10;

/// Figures gathered during the loop.
pub struct LoopStats {
    /// The loss history of the attempts before this one (a resumed training's checkpoint's).
    pub earlier: LossHistory,
    pub first_loss: Option<f64>,
    /// The last [`FINAL_LOSS_STEPS`] losses, on the device.
    pub recent: VecDeque<Tensor>,
    pub tokens_after_first: usize,
    /// When the first step was done.
    pub after_first: Option<Instant>,
    pub started: Instant,
    /// When the last step was done (the device idle).
    pub finished: Instant,
    /// Whether a signal stopped the loop before the last step.
    pub interrupted: bool,
}

impl LoopStats {
    /// The training's loss history so far, over every attempt: the first step's loss and the
    /// last [`FINAL_LOSS_STEPS`] losses. Reads this attempt's recent losses off the device.
    pub fn history(&self) -> LossHistory {
        let mut recent = self.earlier.recent.clone();
        recent.extend(self.recent.iter().map(|t| t.double_value(&[])));
        let older = recent.len().saturating_sub(FINAL_LOSS_STEPS);
        recent.drain(..older);
        LossHistory {
            first_loss: self.earlier.first_loss.or(self.first_loss),
            recent,
        }
    }
}

/// Trains; `input` (the init checkpoint, if any) is verified before a periodic checkpoint is
/// written.
#[allow(clippy::too_many_arguments)]
pub fn train_loop(
    model: &mut ByteGpt,
    opt: &mut AdamW,
    sampler: &Sampler,
    p: &TrainParams,
    compute: &Compute,
    sink: &mut EventSink,
    output_dir: &std::path::Path,
    input: Option<&Verified>,
    earlier: LossHistory,
) -> StageResult<LoopStats> {
    let schedule = Schedule {
        peak: p.lr,
        warmup: p.warmup_steps,
        total: p.steps,
    };
    let mut clock = ProgressClock::new(p.progress_every_s);
    let mut stats = LoopStats {
        earlier,
        first_loss: None,
        recent: VecDeque::with_capacity(FINAL_LOSS_STEPS + 1),
        tokens_after_first: 0,
        after_first: None,
        started: Instant::now(),
        finished: Instant::now(),
        interrupted: false,
    };
    // The optimizer's kernels run exactly where the model's fused kernels do. Asked here, not
    // when the optimizer is made: the first ask loads the kernels (or waits for the warm-up
    // loading them), which the first forward pass would wait for anyway, but loading a
    // checkpoint must not.
    opt.use_kernels(model.fused_kernels(compute.kind));
    let first = opt.step + 1;
    let mut profile = crate::stages::profile::StepProfile::from_env(first, compute.device)?;
    for step in first..=p.steps {
        if let Some(profile) = profile.as_mut() {
            profile.before_step(step)?;
        }
        let batch = sampler.batch(step).to_device(compute.device);
        model.params.zero_grad();
        let loss = model.loss(&batch.inputs, &batch.targets, compute.kind);
        loss.backward();
        let _grad_norm = opt.step(&mut model.params, schedule.lr(step));
        if let Some(profile) = profile.as_mut() {
            profile.after_step(step, step == p.steps || signals::stop_requested())?;
        }
        let loss = loss.detach();
        if step == first {
            // One read-back, which also waits for the first (warm-up) step to finish.
            stats.first_loss = Some(loss.double_value(&[]));
            stats.after_first = Some(Instant::now());
            crate::checkpoint::stream::start_planned_pinning();
        } else {
            stats.tokens_after_first += batch.tokens;
        }
        clock.record(&loss, batch.tokens);
        stats.recent.push_back(loss);
        if stats.recent.len() > FINAL_LOSS_STEPS {
            stats.recent.pop_front();
        }
        let stop = signals::stop_requested();
        if clock.due() || step == p.steps || stop {
            let i = clock.take();
            sink.progress(step, p.steps, Some(i.loss), Some(i.tokens_per_s));
            crate::log!(
                "step {step}/{} loss {:.4} lr {:.2e} {:.0} tokens/s",
                p.steps,
                i.loss,
                schedule.lr(step),
                i.tokens_per_s
            );
        }
        if stop && step < p.steps {
            crate::log!("stop requested; saving a checkpoint at step {step}");
            stats.interrupted = true;
            break;
        }
        if p.checkpoint_every > 0 && step % p.checkpoint_every == 0 && step < p.steps {
            if let Some(v) = input {
                v.finish()?;
            }
            let (_, files) = checkpoint::write(
                output_dir,
                model,
                opt,
                step,
                &training_state(p, false),
                &stats.history(),
                None,
            )?;
            sink.checkpoint_files(files, Some(step));
            crate::log!("periodic checkpoint at step {step}");
        }
    }
    // The last step's progress event read the loss back, so the device is idle here.
    stats.finished = Instant::now();
    Ok(stats)
}

/// The stage's metrics; `first_loss` and `final_loss` (the mean of the last
/// [`FINAL_LOSS_STEPS`] losses) from `history`, which spans every attempt of the training.
pub fn final_metrics(
    stats: &LoopStats,
    history: &LossHistory,
    steps: u64,
    resumed_from: u64,
    n_params: i64,
) -> BTreeMap<String, f64> {
    let end = stats.finished;
    let mut m = BTreeMap::new();
    if let Some(first) = history.first_loss {
        m.insert("first_loss".into(), first);
    }
    if !history.recent.is_empty() {
        let mean = history.recent.iter().sum::<f64>() / history.recent.len() as f64;
        m.insert("final_loss".into(), mean);
    }
    if let Some(t) = stats.after_first {
        let secs = end.duration_since(t).as_secs_f64();
        if stats.tokens_after_first > 0 && secs > 0.0 {
            m.insert(
                "tokens_per_s".into(),
                stats.tokens_after_first as f64 / secs,
            );
        }
    }
    m.insert("steps".into(), steps as f64);
    m.insert(
        "train_wall_s".into(),
        end.duration_since(stats.started).as_secs_f64(),
    );
    m.insert("parameters".into(), n_params as f64);
    if resumed_from > 0 {
        m.insert("resumed_from_step".into(), resumed_from as f64);
    }
    m
}

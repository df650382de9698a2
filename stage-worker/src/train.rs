//! The `train` stage: from scratch or from `init`'s checkpoint, resuming its own interrupted
//! attempt when the output directory holds one.

use crate::checkpoint::{self, LossHistory, TrainingState, Verified};
use crate::data::batch::Sampler;
use crate::data::{self, Split};
use crate::device::{self, Compute};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use crate::model::{validate_config, ByteGpt};
use crate::optim::{AdamW, Schedule};
use crate::progress::ProgressClock;
use crate::signals;
use crate::spec::parse_params;
use crate::warmup;
use protocol::worker::{ModelConfig, StageSpec, TrainParams};
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Instant;
use tch::Tensor;

/// `final_loss` is the mean loss of this many last steps.
const FINAL_LOSS_STEPS: usize = 10;

/// Checks the parameters that serde cannot; the message names the parameter.
pub fn validate(p: &TrainParams) -> StageResult<()> {
    let bad = |m: String| Err(Failure::bad_input(m));
    if p.steps == 0 {
        return bad("params.steps must be at least 1".into());
    }
    if p.batch_size == 0 {
        return bad("params.batch_size must be at least 1".into());
    }
    if p.seq_len == 0 {
        return bad("params.seq_len must be at least 1".into());
    }
    if !(p.lr.is_finite() && p.lr > 0.0) {
        return bad(format!("params.lr must be a positive number, got {}", p.lr));
    }
    if !(p.weight_decay.is_finite() && p.weight_decay >= 0.0) {
        return bad(format!(
            "params.weight_decay must be zero or positive, got {}",
            p.weight_decay
        ));
    }
    if !(p.progress_every_s.is_finite() && p.progress_every_s > 0.0) {
        return bad(format!(
            "params.progress_every_s must be a positive number of seconds, got {}",
            p.progress_every_s
        ));
    }
    device::compute_kind(&p.precision, false)?;
    Ok(())
}

/// The model shape: `init`'s when there is one (a differing `params.model` is ignored, with a
/// note on stderr), else `params.model`.
fn model_config(
    spec: &StageSpec,
    p: &TrainParams,
    init: Option<&Verified>,
) -> StageResult<ModelConfig> {
    let config = match init {
        Some(v) => {
            let c = v.model_config()?;
            if spec.params.contains_key("model") && p.model != c {
                crate::log!(
                    "note: params.model is ignored; the model shape comes from the init checkpoint {} ({c:?})",
                    v.dir.display()
                );
            }
            c
        }
        None => p.model.clone(),
    };
    validate_config(&config).map_err(Failure::bad_input)?;
    if i64::from(p.seq_len) > config.max_seq_len {
        return Err(Failure::bad_input(format!(
            "params.seq_len ({}) exceeds the model's max_seq_len ({})",
            p.seq_len, config.max_seq_len
        )));
    }
    Ok(config)
}

fn training_state(p: &TrainParams, complete: bool) -> TrainingState {
    TrainingState {
        complete,
        total_steps: p.steps,
        data: p.data.clone(),
        seed: p.seed,
    }
}

/// This stage's own interrupted checkpoint in `dir`, if it holds one from the same training
/// (same steps, data, seed and shape) that verifies; anything else is left to be overwritten.
fn resumable(dir: &Path, p: &TrainParams, config: &ModelConfig) -> Option<Verified> {
    if !checkpoint::exists(dir) {
        return None;
    }
    let v = match checkpoint::open_verified(dir) {
        Ok(v) => v,
        Err(e) => {
            crate::log!("not resuming from {}: {e}", dir.display());
            return None;
        }
    };
    let same = v.training() == Some(training_state(p, false))
        && v.model_config().ok().as_ref() == Some(config)
        && v.manifest.step.is_some_and(|s| s < p.steps);
    same.then_some(v)
}

/// File, beside the checkpoint, holding the final metrics of a completed training: a stage
/// killed after its final checkpoint was durable reports them again instead of retraining.
const FINAL_METRICS_FILE: &str = "final_metrics.json";

/// This stage's own *completed* checkpoint in `dir` (same training, all steps done, every file
/// verified), if any: the previous attempt finished its work but was stopped before it could
/// report (a kill between the final checkpoint and the process's exit).
fn completed(dir: &Path, p: &TrainParams, config: &ModelConfig) -> Option<Verified> {
    if !checkpoint::exists(dir) || !dir.join(FINAL_METRICS_FILE).is_file() {
        return None;
    }
    let v = checkpoint::open_verified(dir).ok()?;
    let same = v.training() == Some(training_state(p, true))
        && v.model_config().ok().as_ref() == Some(config)
        && v.manifest.step == Some(p.steps);
    same.then_some(v)
}

/// Reports the completed checkpoint `v` (its files and final metrics) as this attempt's result.
fn report_completed(v: &Verified, sink: &mut EventSink) -> StageResult<()> {
    let metrics_path = v.dir.join(FINAL_METRICS_FILE);
    let metrics: BTreeMap<String, f64> = std::fs::read(&metrics_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| Failure::other(format!("cannot read {}", metrics_path.display())))?;
    let step = v.manifest.step.unwrap_or(0);
    for f in &v.manifest.files {
        let path = v.dir.join(&f.path);
        let identity = std::fs::metadata(&path)
            .ok()
            .map(|m| checkpoint::identity_of(&m));
        sink.checkpoint(path, f.checksum.clone(), f.bytes, Some(step), identity);
    }
    let manifest = v.dir.join(protocol::checkpoint::MANIFEST_FILE);
    let bytes = std::fs::read(&manifest)
        .map_err(|e| Failure::other(format!("cannot read {}: {e}", manifest.display())))?;
    let identity = std::fs::metadata(&manifest)
        .ok()
        .map(|m| checkpoint::identity_of(&m));
    sink.checkpoint(
        manifest,
        crate::fsio::checksum(&bytes),
        bytes.len() as u64,
        Some(step),
        identity,
    );
    crate::log!(
        "the final checkpoint of this training is already complete in {} (step {step}); kept, not retrained",
        v.dir.display()
    );
    sink.metrics(&metrics);
    Ok(())
}

/// Removes the manifest of an output directory's checkpoint that this run will not resume, so
/// that until this run writes its own, the directory cannot pass for this run's output.
fn forget_stale_checkpoint(dir: &Path) -> StageResult<()> {
    if checkpoint::exists(dir) {
        crate::log!(
            "{} holds a checkpoint of another run; it will be replaced",
            dir.display()
        );
        crate::fsio::remove_durably(dir, protocol::checkpoint::MANIFEST_FILE).map_err(|e| {
            Failure::other(format!(
                "cannot remove the old manifest in {}: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(())
}

/// When the stage reached each point, in Unix seconds, as metrics named `t_*`:
/// `t_worker_start` (the process, or the fork server's child, began), `t_cuda_init` (the CUDA
/// driver initialised, no context yet), `t_device_ready` (first device work done), `t_input_complete` (with `input_wait_s`: an init checkpoint still being
/// written when the stage started early was complete; `init_read_early` 1 when its weights
/// were read before that), `t_init_read` (the init checkpoint's bytes in memory, on the thread
/// that reads them), `t_inputs_read` (that thread joined, after the device is ready),
/// `t_model_built` (the model built and loaded; the warm-up may still run),
/// `t_model_ready` (the warm-up done too),
/// `t_first_step`, `t_last_step` (the device idle after the last step), `t_device_released`
/// (the final checkpoint's data all copied to the host and the CUDA context destroyed, when
/// that was done before the files were durable), `t_checkpoint_durable` (every file fsynced
/// and in place).
struct Milestones(BTreeMap<String, f64>);

impl Default for Milestones {
    fn default() -> Self {
        Milestones(BTreeMap::from([(
            "t_worker_start".to_string(),
            crate::log::started_unix(),
        )]))
    }
}

impl Milestones {
    fn mark(&mut self, name: &str) {
        self.0.insert(name.into(), crate::log::unix_now());
    }

    fn at(&mut self, name: &str, when: Instant) {
        let ago = when.elapsed().as_secs_f64();
        self.0.insert(name.into(), crate::log::unix_now() - ago);
    }
}

/// Figures gathered during the loop.
struct LoopStats {
    /// The loss history of the attempts before this one (a resumed training's checkpoint's).
    earlier: LossHistory,
    first_loss: Option<f64>,
    recent: VecDeque<Tensor>,
    tokens_after_first: usize,
    after_first: Option<Instant>,
    started: Instant,
    finished: Instant,
    interrupted: bool,
}

impl LoopStats {
    /// The training's loss history so far, over every attempt: the first step's loss and the
    /// last [`FINAL_LOSS_STEPS`] losses. Reads this attempt's recent losses off the device.
    fn history(&self) -> LossHistory {
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

/// Runs the `train` stage of `spec`, reporting on `sink`.
pub fn run(spec: &StageSpec, sink: &mut EventSink) -> StageResult<()> {
    let p: TrainParams = parse_params(spec)?;
    validate(&p)?;
    // The init checkpoint is read (and its checksum started) while the device starts up; one
    // that its stage is still writing (an early start) is waited for on that thread first.
    let init_reader = spec.init.clone().map(|dir| {
        let spec = spec.clone();
        std::thread::spawn(move || {
            let (v, waited, complete) = checkpoint::open_init(&spec, &dir)?;
            let at = crate::log::unix_now() - complete.elapsed().as_secs_f64();
            Ok((v, waited, at, crate::log::unix_now()))
        })
    });
    let compute = device::prepare(spec.device, &p.precision)?;
    let mut milestones = Milestones::default();
    milestones.mark("t_device_ready");
    if let Some(at) = device::driver_ready_at() {
        milestones.0.insert("t_cuda_init".into(), at);
    }
    crate::log!("stage `{}`: train on {}", spec.stage, compute.description);
    sink.started(&compute.description);

    if compute.device.is_cuda() {
        // `device::prepare` refused an unknown choice already.
        let planned =
            crate::attention::Kernels::from_env().unwrap_or(crate::attention::Kernels::Auto);
        let kernels = planned.for_steps(p.steps);
        crate::attention::apply(kernels);
        if planned == crate::attention::Kernels::Auto {
            crate::log!(
                "attention: {kernels:?} kernels for {} planned steps",
                p.steps
            );
        }
    }
    // Warm the device up (on its own thread) while the inputs are read and the model built.
    let fits =
        |c: &ModelConfig| validate_config(c).is_ok() && i64::from(p.seq_len) <= c.max_seq_len;
    let (batch, seq, kind, device) = (
        p.batch_size as usize,
        p.seq_len as usize,
        compute.kind,
        compute.device,
    );
    // An init checkpoint still being written (an early start): the warm-up takes its shape
    // from the manifest once it is there, on a thread of its own.
    let pending_init = spec
        .init
        .as_deref()
        .filter(|dir| crate::input_wait::pending(spec, dir) && !checkpoint::exists(dir));
    let deferred_warm_up = pending_init.map(|dir| {
        let (spec, dir) = (spec.clone(), dir.to_path_buf());
        std::thread::spawn(move || {
            crate::input_wait::await_input(&spec, &dir).ok()?;
            let c = checkpoint::peek_model_config(&dir).ok()?;
            let fits = validate_config(&c).is_ok() && seq as i64 <= c.max_seq_len;
            fits.then(|| warmup::start(&c, batch, seq, kind, device))?
                .map(warmup::WarmUp::finish)
        })
    });
    let warm_shape = match spec.init.as_deref() {
        _ if pending_init.is_some() => None,
        Some(dir) => checkpoint::peek_model_config(dir).ok(),
        None => Some(p.model.clone()),
    };
    let warm_up = warm_shape
        .filter(fits)
        .and_then(|c| warmup::start(&c, batch, seq, kind, device));
    // The init checkpoint's checksum is computed alongside; it is checked before anything
    // derived from it is written (see `Verified::finish`).
    let init = init_reader
        .map(|reader| {
            reader
                .join()
                .unwrap_or_else(|_| Err(Failure::other("reading the init checkpoint panicked")))
        })
        .transpose()?
        .map(|(v, waited, at, read)| {
            milestones.0.insert("t_init_read".into(), read);
            if !waited.is_zero() {
                milestones.0.insert("t_input_complete".into(), at);
                milestones
                    .0
                    .insert("input_wait_s".into(), waited.as_secs_f64());
                let early = f64::from(u8::from(v.read_early()));
                milestones.0.insert("init_read_early".into(), early);
            }
            v
        });
    milestones.mark("t_inputs_read");
    let config = model_config(spec, &p, init.as_ref())?;
    if let Some(done) = completed(&spec.output_dir, &p, &config) {
        return report_completed(&done, sink);
    }
    let data = data::load(&p.data, p.seed, Split::Train, 0)?;
    let sampler = Sampler::new(&data, p.seed, p.batch_size as usize, p.seq_len as usize)
        .map_err(|e| Failure::bad_input(format!("params.data `{}`: {e}", p.data)))?;
    crate::log!("data `{}`: {}", p.data, data.describe());
    if sampler.skipped() > 0 {
        crate::log!(
            "{} examples skipped: their prompt does not fit in seq_len {}",
            sampler.skipped(),
            p.seq_len
        );
    }

    let own = resumable(&spec.output_dir, &p, &config);
    // A resumed training's metrics go on from its checkpoint's losses.
    let earlier = own.as_ref().and_then(Verified::losses).unwrap_or_default();
    // Weights that a checkpoint overwrites whole are not drawn first (drawing them would also
    // load the random-number kernels into the context, which the warm-up then waits behind).
    let mut model = if own.is_some() || init.is_some() {
        ByteGpt::zeroed(&config, compute.device)
    } else {
        ByteGpt::new(&config, compute.device, p.seed)
    };
    let mut opt = AdamW::new(&model.params, p.weight_decay);
    if let Some(own) = own {
        own.load_model(&model)?;
        own.load_optimizer(&model, &mut opt)?;
        crate::log!(
            "resuming the interrupted run in {} at step {}",
            own.dir.display(),
            opt.step
        );
    } else {
        forget_stale_checkpoint(&spec.output_dir)?;
        if let Some(v) = &init {
            v.load_model(&model)?;
            // The weights' checksum as listed (and verified before anything derived is
            // written), naming exactly which checkpoint this stage started from.
            let listed = v
                .manifest
                .files
                .iter()
                .find(|f| f.path == checkpoint::MODEL_FILE)
                .map_or("", |f| f.checksum.hex());
            crate::log!(
                "initialised from {} ({} {listed})",
                v.dir.display(),
                checkpoint::MODEL_FILE
            );
            if v.training().is_some_and(|t| !t.complete) {
                crate::log!(
                    "note: that checkpoint is from an interrupted run (step {:?})",
                    v.manifest.step
                );
            }
        }
    }
    let resumed_from = opt.step;
    milestones.mark("t_model_built");
    if let Some(w) = warm_up {
        w.finish();
    }
    if let Some(w) = deferred_warm_up {
        let _ = w.join();
    }
    milestones.mark("t_model_ready");
    // Page-lock the checkpoint's host buffers while the stage trains (from its second step), so
    // that its copies off the device run at the bus's speed (see `stream::pin_host_buffers`).
    if crate::stream::pinning_wanted(compute.device) {
        // The model's file has one run of the parameters, the optimizer's two (the moments).
        crate::stream::plan_pinning(crate::stream::buffers_for(model.params.numel(), 3));
    }
    crate::log!(
        "model {config:?}, {} parameters; {} steps of {}×{}",
        model.params.numel(),
        p.steps,
        p.batch_size,
        p.seq_len
    );

    let stats = train_loop(
        &mut model,
        &mut opt,
        &sampler,
        &p,
        &compute,
        sink,
        &spec.output_dir,
        init.as_ref(),
        earlier,
    )?;
    if !stats.interrupted && device::early_release_wanted(compute.device) {
        // The device work ends with the checkpoint's copies: the next stage's process may get
        // ready meanwhile (`stage_standby`).
        sink.finishing();
    }
    if let Some(v) = &init {
        v.finish()?;
    }
    let complete = !stats.interrupted;
    let history = stats.history();
    let metrics = final_metrics(
        &stats,
        &history,
        opt.step,
        resumed_from,
        model.params.numel(),
    );
    if complete {
        // Before the checkpoint's manifest: once the manifest says "complete", the metrics
        // that go with it are on disk too.
        let mut text = serde_json::to_vec_pretty(&metrics).expect("metrics serialize");
        text.push(b'\n');
        std::fs::create_dir_all(&spec.output_dir)
            .and_then(|()| crate::fsio::write_atomic(&spec.output_dir, FINAL_METRICS_FILE, &text))
            .map_err(|e| {
                Failure::other(format!(
                    "cannot write {}: {e}",
                    spec.output_dir.join(FINAL_METRICS_FILE).display()
                ))
            })?;
    }
    let checkpoint_started = Instant::now();
    // The final checkpoint of a complete training is the stage's last device work: the device
    // is given back as soon as the data is on the host (the disk finishes after).
    let release = complete && device::early_release_wanted(compute.device);
    let written = checkpoint::write(
        &spec.output_dir,
        &model,
        &opt,
        opt.step,
        &training_state(&p, complete),
        &history,
        release,
    );
    let step = opt.step;
    let pinned = crate::stream::pinned_buffers();
    if let Some(at) = device::released_at() {
        milestones.0.insert("t_device_released".into(), at);
        if let Some(at) = device::driver_closed_at() {
            milestones.0.insert("t_driver_closed".into(), at);
        }
        // The CUDA context is gone: freeing these tensors would call into it (and could
        // create a new one). The process exits right after this stage; the OS frees them.
        std::mem::forget(model);
        std::mem::forget(opt);
        std::mem::forget(stats.recent);
    }
    let (_, files) = written?;
    let phases: Vec<(String, f64)> = files.iter().flat_map(|f| f.phases.clone()).collect();
    sink.checkpoint_files(files, Some(step));
    if stats.interrupted {
        return Err(Failure::interrupted(format!(
            "stopped by a signal after step {} of {}; a resumable checkpoint is in {}",
            step,
            p.steps,
            spec.output_dir.display()
        )));
    }
    milestones.mark("t_checkpoint_durable");
    let mut metrics = metrics;
    metrics.insert(
        "checkpoint_write_s".into(),
        checkpoint_started.elapsed().as_secs_f64(),
    );
    if let Some(t) = stats.after_first {
        milestones.at("t_first_step", t);
    }
    milestones.at("t_last_step", stats.finished);
    metrics.extend(milestones.0);
    metrics.extend(phases);
    if compute.device.is_cuda() {
        // For the boundary benchmark (the console's result line shows these too, so CPU stages,
        // where neither applies, leave them out).
        // Every step is a fused AdamW (the worker's kernels or libtorch's); kept for the
        // benchmarks that read it.
        metrics.insert("fused_adamw".into(), 1.0);
        metrics.insert("pinned_buffers".into(), pinned as f64);
    }
    crate::log!("metrics {metrics:?}");
    sink.metrics(&metrics);
    Ok(())
}

/// Trains; `input` (the init checkpoint, if any) is verified before a periodic checkpoint is
/// written.
#[allow(clippy::too_many_arguments)]
fn train_loop(
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
    let mut profile = crate::profile::StepProfile::from_env(first, compute.device)?;
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
            crate::stream::start_planned_pinning();
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
                false,
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
fn final_metrics(
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

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::worker::{Device as SpecDevice, WorkerEvent};

    fn tiny_spec(dir: &Path, steps: u64) -> StageSpec {
        let params = serde_json::json!({
            "data": "synthetic:pretrain",
            "steps": steps,
            "batch_size": 8,
            "seq_len": 32,
            "lr": 1e-2,
            "warmup_steps": 5,
            "seed": 4,
            "progress_every_s": 0.01,
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}
        });
        StageSpec {
            v: protocol::PROTOCOL_VERSION,
            stage: "t".into(),
            kind: Some(protocol::plan::BuiltinKind::Train),
            params: params.as_object().unwrap().clone(),
            output_dir: dir.to_path_buf(),
            inputs: Default::default(),
            init: None,
            device: SpecDevice::Cpu,
            attempt: 1,
            inputs_being_written: Vec::new(),
            input_wait_limit_s: None,
        }
    }

    #[test]
    fn a_few_steps_reduce_the_loss_and_leave_a_checkpoint() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("train");
        let spec = tiny_spec(&dir, 60);
        let mut sink = EventSink::memory();
        run(&spec, &mut sink).unwrap();
        let events: Vec<&WorkerEvent> = sink.recorded().iter().map(|m| &m.event).collect();
        assert!(matches!(events[0], WorkerEvent::Started { .. }));
        let checkpoints = events
            .iter()
            .filter(|e| matches!(e, WorkerEvent::Checkpoint { .. }))
            .count();
        assert_eq!(checkpoints, 3);
        let Some(WorkerEvent::Metrics { metrics }) = events.last() else {
            panic!("last event is not metrics: {events:?}")
        };
        let (first, last) = (metrics["first_loss"], metrics["final_loss"]);
        assert!(
            first > 5.0,
            "a fresh byte model starts near ln 256: {first}"
        );
        assert!(last < first - 1.5, "loss went {first} -> {last}");
        assert_eq!(metrics["steps"], 60.0);
        assert!(metrics["tokens_per_s"] > 0.0);
        let last_progress = events
            .iter()
            .rev()
            .find_map(|e| match e {
                WorkerEvent::Progress { step, .. } => Some(*step),
                _ => None,
            })
            .unwrap();
        assert_eq!(last_progress, 60);
        let v = checkpoint::open_verified(&dir).unwrap();
        assert_eq!(v.manifest.step, Some(60));
        assert_eq!(v.training().map(|t| t.complete), Some(true));
    }

    #[test]
    fn bad_params_are_refused_as_bad_input() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("train-bad");
        let mut spec = tiny_spec(&dir, 5);
        spec.params.insert("seq_len".into(), 64.into());
        let err = run(&spec, &mut EventSink::memory()).unwrap_err();
        assert_eq!(err.kind, crate::failure::FailureKind::BadInput);
        assert!(err.message.contains("max_seq_len"), "{}", err.message);
        spec.params.insert("seq_len".into(), 16.into());
        spec.params.insert("data".into(), "synthetic:nope".into());
        let err = run(&spec, &mut EventSink::memory()).unwrap_err();
        assert!(err.message.contains("synthetic:nope"), "{}", err.message);
    }
}

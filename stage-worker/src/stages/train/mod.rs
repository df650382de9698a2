//! The `train` stage: from scratch or from `init`'s checkpoint, resuming its own interrupted
//! attempt when the output directory holds one.
//!
//! [`run`] goes through four phases, each a function of its own that hands the next what it
//! made, the stage's [`Milestones`] among it: [`start_up`] (the init checkpoint read and the
//! device started and warmed up, side by side), [`build_model`] (the model and optimizer,
//! from the checkpoint resumed, the init checkpoint or a seed), [`train`] (the steps, and the
//! final metrics of a complete training written) and [`persist`] (the final checkpoint, the
//! device given back early where it may be, the metrics reported).

mod earlier;
pub mod ending;
pub mod milestones;
mod steps;

use crate::boot::spec::parse_params;
use crate::boot::warmup;
use crate::checkpoint::{self, LossHistory, Verified};
use crate::data::batch::Sampler;
use crate::data::{self, Split};
use crate::device::{self, Compute};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use crate::model::optim::AdamW;
use crate::model::{validate_config, ByteGpt};
use earlier::{completed, resumable, training_state};
pub use earlier::{forget_stale_checkpoint, report_completed, write_final_metrics};
use ending::Ending;
use milestones::Milestones;
use protocol::worker::{ModelConfig, StageSpec, TrainParams};
use std::collections::BTreeMap;
use std::thread::JoinHandle;
use steps::LoopStats;

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

/// Runs the `train` stage of `spec`, reporting on `sink`.
pub fn run(spec: &StageSpec, sink: &mut EventSink) -> StageResult<()> {
    let p: TrainParams = parse_params(spec)?;
    validate(&p)?;
    let started = start_up(spec, &p, sink)?;
    let config = model_config(spec, &p, started.init.as_ref())?;
    if let Some(done) = completed(&spec.output_dir, &p, &config) {
        return report_completed(&done, sink);
    }
    let data = data::load(&p.data, p.seed, Split::Train, 0)?;
    let sampler = sampler(&data, &p)?;
    let built = build_model(spec, &p, &config, started)?;
    let trained = train(spec, &p, &sampler, built, sink)?;
    persist(spec, &p, trained, sink)
}

/// The init checkpoint being read, its verdict and the moments of its reading.
type InitReader = JoinHandle<StageResult<(Verified, std::time::Duration, f64, f64)>>;

/// The device warming up for the model: now, or once an init checkpoint still being written
/// has its manifest (which gives the shape).
struct WarmUps {
    now: Option<warmup::WarmUp>,
    deferred: Option<JoinHandle<Option<()>>>,
}

impl WarmUps {
    /// Waits for both (a warm-up only ever saves time: whatever happened to it is ignored).
    fn finish(self) {
        if let Some(w) = self.now {
            w.finish();
        }
        if let Some(w) = self.deferred {
            let _ = w.join();
        }
    }
}

/// What [`start_up`] leaves: the device ready (and warming up), the init checkpoint read.
struct Startup {
    compute: Compute,
    init: Option<Verified>,
    warm_ups: WarmUps,
    milestones: Milestones,
}

/// Phase 1: reads the init checkpoint (and starts its checksum) on a thread of its own while
/// the device starts, sends `started`, chooses the attention kernels and starts the device's
/// warm-up; then waits for the init checkpoint.
fn start_up(spec: &StageSpec, p: &TrainParams, sink: &mut EventSink) -> StageResult<Startup> {
    let init_reader = read_init(spec);
    let compute = device::prepare(spec.device, &p.precision)?;
    let mut milestones = Milestones::new();
    milestones.mark("t_device_ready");
    if let Some(at) = compute.driver_ready_at {
        milestones.set("t_cuda_init", at);
    }
    crate::log!("stage `{}`: train on {}", spec.stage, compute.description);
    sink.started(&compute.description);
    if compute.device.is_cuda() {
        choose_attention(p.steps);
    }
    // Warm the device up (on its own thread) while the inputs are read and the model built.
    let warm_ups = start_warm_ups(spec, p, &compute);
    // The init checkpoint's checksum is computed alongside; it is checked before anything
    // derived from it is written (see `Verified::finish`).
    let init = init_reader
        .map(|reader| join_init(reader, &mut milestones))
        .transpose()?;
    milestones.mark("t_inputs_read");
    Ok(Startup {
        compute,
        init,
        warm_ups,
        milestones,
    })
}

/// The init checkpoint read on a thread of its own; one that its stage is still writing (an
/// early start) is waited for on that thread first.
fn read_init(spec: &StageSpec) -> Option<InitReader> {
    spec.init.clone().map(|dir| {
        let spec = spec.clone();
        std::thread::spawn(move || {
            let (v, waited, complete) = checkpoint::open_init(&spec, &dir)?;
            let at = crate::log::unix_now() - complete.elapsed().as_secs_f64();
            Ok((v, waited, at, crate::log::unix_now()))
        })
    })
}

/// The init checkpoint from its reader, with `t_init_read` and, when it was waited for,
/// `t_input_complete`, `input_wait_s` and `init_read_early` in `milestones`.
fn join_init(reader: InitReader, milestones: &mut Milestones) -> StageResult<Verified> {
    let (v, waited, at, read) = reader
        .join()
        .unwrap_or_else(|_| Err(Failure::other("reading the init checkpoint panicked")))?;
    milestones.set("t_init_read", read);
    if !waited.is_zero() {
        milestones.set("t_input_complete", at);
        milestones.set("input_wait_s", waited.as_secs_f64());
        milestones.set("init_read_early", f64::from(u8::from(v.read_early())));
    }
    Ok(v)
}

/// Applies the attention kernels for a stage of `steps` planned steps on CUDA.
fn choose_attention(steps: u64) {
    use crate::model::attention::{self, Kernels};
    // `device::prepare` refused an unknown choice already.
    let planned = Kernels::from_env().unwrap_or(Kernels::Auto);
    let kernels = planned.for_steps(steps);
    attention::apply(kernels);
    if planned == Kernels::Auto {
        crate::log!("attention: {kernels:?} kernels for {steps} planned steps");
    }
}

/// Starts the device's warm-up for the model's shape: `params.model`'s, or the init
/// checkpoint's; for an init checkpoint still being written (an early start), on a thread of
/// its own once its manifest is there.
fn start_warm_ups(spec: &StageSpec, p: &TrainParams, compute: &Compute) -> WarmUps {
    let fits =
        |c: &ModelConfig| validate_config(c).is_ok() && i64::from(p.seq_len) <= c.max_seq_len;
    let (batch, seq, kind, device) = (
        p.batch_size as usize,
        p.seq_len as usize,
        compute.kind,
        compute.device,
    );
    let pending_init = spec.init.as_deref().filter(|dir| {
        crate::checkpoint::input_wait::pending(spec, dir) && !checkpoint::exists(dir)
    });
    let deferred = pending_init.map(|dir| {
        let (spec, dir) = (spec.clone(), dir.to_path_buf());
        std::thread::spawn(move || {
            crate::checkpoint::input_wait::await_input(&spec, &dir).ok()?;
            let c = checkpoint::peek_model_config(&dir).ok()?;
            let fits = validate_config(&c).is_ok() && seq as i64 <= c.max_seq_len;
            fits.then(|| warmup::start(&c, batch, seq, kind, device))?
                .map(warmup::WarmUp::finish)
        })
    });
    let shape = match spec.init.as_deref() {
        _ if pending_init.is_some() => None,
        Some(dir) => checkpoint::peek_model_config(dir).ok(),
        None => Some(p.model.clone()),
    };
    let now = shape
        .filter(fits)
        .and_then(|c| warmup::start(&c, batch, seq, kind, device));
    WarmUps { now, deferred }
}

/// The batches of `data` for this training.
fn sampler<'a>(data: &'a data::Dataset, p: &TrainParams) -> StageResult<Sampler<'a>> {
    let sampler = Sampler::new(data, p.seed, p.batch_size as usize, p.seq_len as usize)
        .map_err(|e| Failure::bad_input(format!("params.data `{}`: {e}", p.data)))?;
    crate::log!("data `{}`: {}", p.data, data.describe());
    if sampler.skipped() > 0 {
        crate::log!(
            "{} examples skipped: their prompt does not fit in seq_len {}",
            sampler.skipped(),
            p.seq_len
        );
    }
    Ok(sampler)
}

/// What [`build_model`] leaves: the model and optimizer ready for the first step.
struct Built {
    compute: Compute,
    init: Option<Verified>,
    model: ByteGpt,
    opt: AdamW,
    /// The loss history of the attempt resumed, if any.
    earlier: LossHistory,
    /// The step the training resumed from (0 for a fresh one).
    resumed_from: u64,
    milestones: Milestones,
}

/// Phase 2: the model and optimizer shaped `config`: this stage's own interrupted attempt
/// resumed, else the init checkpoint's weights (a stale checkpoint in the output directory
/// forgotten), else drawn from the seed; then the warm-up waited for.
fn build_model(
    spec: &StageSpec,
    p: &TrainParams,
    config: &ModelConfig,
    started: Startup,
) -> StageResult<Built> {
    let Startup {
        compute,
        init,
        warm_ups,
        mut milestones,
    } = started;
    let own = resumable(&spec.output_dir, p, config);
    // A resumed training's metrics go on from its checkpoint's losses.
    let earlier = own.as_ref().and_then(Verified::losses).unwrap_or_default();
    // Weights that a checkpoint overwrites whole are not drawn first (drawing them would also
    // load the random-number kernels into the context, which the warm-up then waits behind).
    let model = if own.is_some() || init.is_some() {
        ByteGpt::zeroed(config, compute.device)
    } else {
        ByteGpt::new(config, compute.device, p.seed)
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
            load_init(v, &model)?;
        }
    }
    let resumed_from = opt.step;
    milestones.mark("t_model_built");
    warm_ups.finish();
    milestones.mark("t_model_ready");
    // Page-lock the checkpoint's host buffers while the stage trains (from its second step), so
    // that its copies off the device run at the bus's speed (see `stream::pin_host_buffers`).
    if crate::checkpoint::stream::pinning_wanted(compute.device) {
        // The model's file has one run of the parameters, the optimizer's two (the moments).
        crate::checkpoint::stream::plan_pinning(crate::checkpoint::stream::buffers_for(
            model.params.numel(),
            3,
        ));
    }
    crate::log!(
        "model {config:?}, {} parameters; {} steps of {}×{}",
        model.params.numel(),
        p.steps,
        p.batch_size,
        p.seq_len
    );
    Ok(Built {
        compute,
        init,
        model,
        opt,
        earlier,
        resumed_from,
        milestones,
    })
}

/// Loads the init checkpoint `v`'s weights into `model`, saying which checkpoint it was.
fn load_init(v: &Verified, model: &ByteGpt) -> StageResult<()> {
    v.load_model(model)?;
    // The weights' checksum as listed (and verified before anything derived is written),
    // naming exactly which checkpoint this stage started from.
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
    Ok(())
}

/// What [`train`] leaves: the trained model and optimizer and the training's metrics so far.
struct Trained {
    compute: Compute,
    model: ByteGpt,
    opt: AdamW,
    stats: LoopStats,
    history: LossHistory,
    metrics: BTreeMap<String, f64>,
    milestones: Milestones,
}

/// Phase 3: the steps; then `finishing` sent when the device is about to be given back, the
/// init checkpoint's checksums awaited, and a complete training's final metrics written
/// beside its checkpoint.
fn train(
    spec: &StageSpec,
    p: &TrainParams,
    sampler: &Sampler,
    built: Built,
    sink: &mut EventSink,
) -> StageResult<Trained> {
    let Built {
        compute,
        init,
        mut model,
        mut opt,
        earlier,
        resumed_from,
        milestones,
    } = built;
    let stats = steps::train_loop(
        &mut model,
        &mut opt,
        sampler,
        p,
        &compute,
        sink,
        &spec.output_dir,
        init.as_ref(),
        earlier,
    )?;
    if ending::releases_early(!stats.interrupted, &compute) {
        // The device work ends with the checkpoint's copies: the next stage's process may get
        // ready meanwhile (`boot::standby`).
        sink.finishing();
    }
    if let Some(v) = &init {
        v.finish()?;
    }
    let history = stats.history();
    let metrics = steps::final_metrics(
        &stats,
        &history,
        opt.step,
        resumed_from,
        model.params.numel(),
    );
    if !stats.interrupted {
        earlier::write_final_metrics(&spec.output_dir, &metrics)?;
    }
    Ok(Trained {
        compute,
        model,
        opt,
        stats,
        history,
        metrics,
        milestones,
    })
}

/// Phase 4: the final checkpoint (the device given back as soon as its data is on the host,
/// for a complete training where that is wanted), its files reported, and then the metrics;
/// an interrupted training fails as such once its checkpoint is durable (see
/// [`ending::finish`]).
fn persist(
    spec: &StageSpec,
    p: &TrainParams,
    trained: Trained,
    sink: &mut EventSink,
) -> StageResult<()> {
    let Trained {
        compute,
        model,
        opt,
        stats,
        history,
        metrics,
        milestones,
    } = trained;
    let ending = Ending {
        complete: !stats.interrupted,
        step: opt.step,
        total_steps: p.steps,
        after_first: stats.after_first,
        finished: stats.finished,
        metrics,
        milestones,
    };
    let training = training_state(p, ending.complete);
    let write = |(model, opt, _): &(ByteGpt, AdamW, _), released: Option<&mut _>| {
        let dir = &spec.output_dir;
        checkpoint::write(dir, model, opt, opt.step, &training, &history, released)
            .map(|(_, files)| files)
    };
    let on_device = (model, opt, stats.recent);
    ending::finish(&spec.output_dir, &compute, ending, on_device, write, sink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::worker::{Device as SpecDevice, WorkerEvent};
    use std::path::Path;

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

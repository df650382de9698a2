//! The `train` stage of a Llama model: from the Hugging Face directory `init` names, on a local
//! file tokenized with that directory's `tokenizer.json`, to a Hugging Face directory in the
//! output (see [`super`]), resuming this stage's own interrupted attempt where it left one.

use super::data::{self, TokenData, Tokens};
use super::load_verified;
use crate::boot::signals;
use crate::boot::spec::parse_params;
use crate::checkpoint::fsio::WrittenFile;
use crate::checkpoint::hf;
use crate::checkpoint::stream::{self, FileSpec, Run};
use crate::checkpoint::{self, input_wait, LossHistory, TrainingState, Verified};
use crate::device::{self, Compute, Released};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use crate::model::llama::{Llama, ARCH};
use crate::model::optim::{AdamW, Schedule};
use crate::stages::progress::ProgressClock;
use crate::stages::train::ending::{self, releases_early, Ending};
use crate::stages::train::milestones::Milestones;
use protocol::worker::{StageSpec, TrainParams};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `final_loss` is the mean loss of this many last steps.
const FINAL_LOSS_STEPS: usize = 10;
/// A path: every step's loss is written there as JSON (`{"first_step": N, "losses": [...]}`)
/// when the loop ends, read back from the device only then (bench/llama compares the curve
/// with PyTorch's).
pub const LOSS_LOG_ENV: &str = "STAGE_WORKER_LOSS_LOG";

fn training_state(p: &TrainParams, complete: bool) -> TrainingState {
    TrainingState {
        complete,
        total_steps: p.steps,
        data: p.data.clone(),
        seed: p.seed,
    }
}

/// This stage's own interrupted checkpoint of the same training in `dir`, verified.
fn resumable(dir: &Path, p: &TrainParams) -> Option<Verified> {
    if !checkpoint::exists(dir) {
        return None;
    }
    let v = checkpoint::open_verified(dir).ok()?;
    let same = v.manifest.model.get("arch").and_then(|a| a.as_str()) == Some(ARCH)
        && v.training() == Some(training_state(p, false))
        && v.manifest.step.is_some_and(|s| s < p.steps);
    same.then_some(v)
}

/// This stage's own *completed* checkpoint of the same training in `dir` (all steps done, its
/// final metrics beside it, every file verified): an attempt killed after its final checkpoint
/// was durable reports it again instead of retraining.
fn completed(dir: &Path, p: &TrainParams) -> Option<Verified> {
    if !checkpoint::exists(dir) || !dir.join("final_metrics.json").is_file() {
        return None;
    }
    let v = checkpoint::open_verified(dir).ok()?;
    let same = v.manifest.model.get("arch").and_then(|a| a.as_str()) == Some(ARCH)
        && v.training() == Some(training_state(p, true))
        && v.manifest.step == Some(p.steps);
    same.then_some(v)
}

/// Where the model came from: the directory its tokenizer and companion files are copied
/// from, and, where that is a checkpoint a stage wrote, its verification.
struct Source {
    dir: PathBuf,
    /// The init checkpoint whose weights the model holds, their checksum computed alongside.
    init: Option<Verified>,
}

impl Source {
    /// Whether the weights the model started from matched their manifest (waiting for their
    /// checksum): checked before anything derived from them is written.
    fn check(&self) -> StageResult<()> {
        self.init.as_ref().map_or(Ok(()), Verified::finish)
    }
}

/// The model, its optimizer, the loss history so far, and where the model came from.
struct Start {
    model: Llama,
    opt: AdamW,
    earlier: LossHistory,
    source: Source,
}

/// The model from `init` (its weights from `opened`, when [`open_init`] opened it as a
/// checkpoint), or from this stage's interrupted checkpoint, with its optimizer.
fn start(
    spec: &StageSpec,
    init: &Path,
    opened: Option<Verified>,
    p: &TrainParams,
    compute: &Compute,
) -> StageResult<Start> {
    if let Some(own) = resumable(&spec.output_dir, p) {
        let model = load_verified(&own, compute.device)?;
        let mut opt = AdamW::new(&model.params, p.weight_decay);
        let tensors = own.tensors(checkpoint::OPTIMIZER_FILE)?;
        opt.load(&model.params, &tensors, "the optimizer state")
            .map_err(Failure::bad_input)?;
        crate::log!(
            "resuming the interrupted run in {} at step {}",
            own.dir.display(),
            opt.step
        );
        let earlier = own.losses().unwrap_or_default();
        let dir = own.dir.clone();
        return Ok(Start {
            model,
            opt,
            earlier,
            source: Source { dir, init: None },
        });
    }
    crate::stages::train::forget_stale_checkpoint(&spec.output_dir)?;
    let model = match &opened {
        Some(v) => load_verified(v, compute.device)?,
        None => hf::load(init, compute.device).map_err(Failure::bad_input)?,
    };
    crate::log!(
        "initialised from the Hugging Face model in {}",
        init.display()
    );
    let opt = AdamW::new(&model.params, p.weight_decay);
    Ok(Start {
        model,
        opt,
        earlier: LossHistory::default(),
        source: Source {
            dir: init.to_path_buf(),
            init: opened,
        },
    })
}

/// `init` opened as the byte-level model's init checkpoint is, where a stage wrote it (it is
/// being written, an early start, or it has a manifest): waited for, every listed file's size
/// checked, `model.safetensors` read (while waiting, where it can be) and its checksum
/// computed alongside, with the byte-level stage's milestones (`t_init_read`,
/// `t_input_complete`, `input_wait_s`, `init_read_early`). `None` where there is no manifest
/// (a directory `save_pretrained` wrote) or it lists no `model.safetensors` (shards): the
/// files are then read as they are.
fn open_init(
    spec: &StageSpec,
    init: &Path,
    milestones: &mut Milestones,
) -> StageResult<Option<Verified>> {
    if !input_wait::pending(spec, init) && !checkpoint::exists(init) {
        return Ok(None);
    }
    let (v, waited, complete) = checkpoint::open_init(spec, init)?;
    milestones.mark("t_init_read");
    if !waited.is_zero() {
        milestones.at("t_input_complete", complete);
        milestones.set("input_wait_s", waited.as_secs_f64());
        milestones.set("init_read_early", f64::from(u8::from(v.read_early())));
    }
    let listed = v
        .manifest
        .files
        .iter()
        .any(|f| f.path == checkpoint::MODEL_FILE);
    Ok(listed.then_some(v))
}

/// Runs the `train` stage of `spec` on the Llama model in `init`, reporting on `sink`.
pub fn run(spec: &StageSpec, init: &Path, sink: &mut EventSink) -> StageResult<()> {
    let p: TrainParams = parse_params(spec)?;
    crate::stages::train::validate(&p)?;
    if spec.params.contains_key("model") {
        crate::log!(
            "note: params.model is ignored; the model is the one in {}",
            init.display()
        );
    }
    let compute = device::prepare(spec.device, &p.precision)?;
    let mut milestones = Milestones::new();
    milestones.mark("t_device_ready");
    crate::log!(
        "stage `{}`: train a Llama model on {}",
        spec.stage,
        compute.description
    );
    sink.started(&compute.description);
    // An upstream Llama stage that released its device may still be writing `init` (an early
    // start): its weights are used once its manifest is there.
    let opened = open_init(spec, init, &mut milestones)?;
    if let Some(done) = completed(&spec.output_dir, &p) {
        return crate::stages::train::report_completed(&done, sink);
    }
    let data = read_data(init, &p, &compute)?;
    let Start {
        mut model,
        mut opt,
        earlier,
        source,
    } = start(spec, init, opened, &p, &compute)?;
    milestones.mark("t_model_ready");
    crate::log!(
        "Llama model: {} parameters, {} layers, width {}; {} steps of {}×{}",
        model.params.numel(),
        model.config.num_hidden_layers,
        model.config.hidden_size,
        p.steps,
        p.batch_size,
        p.seq_len
    );
    // Page-lock the checkpoint's host buffers while the stage trains, as the byte-level
    // model does: its two files are three runs of the parameters' size.
    if stream::pinning_wanted(compute.device) {
        stream::plan_pinning(stream::buffers_for(model.params.numel(), 3));
    }
    let resumed_from = opt.step;
    let stats = train_loop(
        &mut model, &mut opt, &data, &p, &compute, sink, &source, spec, earlier,
    )?;
    persist(
        spec,
        &p,
        &compute,
        (model, opt, source, resumed_from),
        stats,
        milestones,
        sink,
    )
}

/// `config.json`'s shape checked against the parameters (and the attention kernels chosen for
/// it on CUDA), and the data `p` names, tokenized with `init`'s tokenizer.
fn read_data(init: &Path, p: &TrainParams, compute: &Compute) -> StageResult<TokenData> {
    let config = hf::read_config(init).map_err(Failure::bad_input)?;
    if i64::from(p.seq_len) > config.max_position_embeddings {
        return Err(Failure::bad_input(format!(
            "params.seq_len ({}) exceeds the model's max_position_embeddings ({})",
            p.seq_len, config.max_position_embeddings
        )));
    }
    if compute.device.is_cuda() {
        super::choose_attention(&config, p.steps, p.batch_size, p.seq_len);
    }
    let tokens = Tokens::open(init, &config.raw)?;
    let data = data::load(&p.data, &tokens)?;
    data.check(p.seq_len as usize)
        .map_err(|e| Failure::bad_input(format!("params.data `{}`: {e}", p.data)))?;
    crate::log!("data `{}`: {}", p.data, data.describe());
    Ok(data)
}

/// The model, its optimizer, where it came from, and the step the training resumed from.
type Trained = (Llama, AdamW, Source, u64);

/// After the loop: `finishing` sent where the device goes back early, a complete training's
/// final metrics written, then the final checkpoint, the release, the files and the metrics
/// as for the byte-level model ([`ending::finish`]).
fn persist(
    spec: &StageSpec,
    p: &TrainParams,
    compute: &Compute,
    (model, opt, source, resumed_from): Trained,
    stats: LoopStats,
    milestones: Milestones,
    sink: &mut EventSink,
) -> StageResult<()> {
    let complete = !stats.interrupted;
    if releases_early(complete, compute) {
        // The device work ends with the checkpoint's copies (see the byte-level `train`).
        sink.finishing();
    }
    let history = stats.history();
    let mut metrics = stats.metrics(&history, opt.step, model.params.numel());
    if resumed_from > 0 {
        metrics.insert("resumed_from_step".into(), resumed_from as f64);
    }
    // Nothing derived from unverified weights is written.
    source.check()?;
    if complete {
        crate::stages::train::write_final_metrics(&spec.output_dir, &metrics)?;
    }
    let ending = Ending {
        complete,
        step: opt.step,
        total_steps: p.steps,
        after_first: stats.after_first,
        finished: stats.finished,
        metrics,
        milestones,
    };
    let training = training_state(p, complete);
    let write = |(model, opt, _): &(Llama, AdamW, _), released: Option<&mut _>| {
        write(spec, model, opt, &source, &training, &history, released)
    };
    let on_device = (model, opt, stats.recent);
    ending::finish(&spec.output_dir, compute, ending, on_device, write, sink)
}

/// Writes the model as a Hugging Face directory in the output, through the streaming writer
/// of the byte-level model's checkpoints ([`checkpoint::write_streamed`], with its promises
/// and its release where `released` is given): `config.json` and the tokenizer's files first,
/// then `model.safetensors` (the parameters' flat buffer under transformers' names, fp32,
/// `format = pt`) and `optimizer.safetensors`, then the manifest (last) recording the
/// training's state; not before the weights the model started from are verified
/// ([`Source::check`]). Returns the files written, the manifest last.
fn write(
    spec: &StageSpec,
    model: &Llama,
    opt: &AdamW,
    source: &Source,
    training: &TrainingState,
    history: &LossHistory,
    released: Option<&mut Option<Released>>,
) -> StageResult<Vec<WrittenFile>> {
    source.check()?;
    let ahead = hf::companion_files(model, &source.dir)
        .map_err(Failure::other)?
        .into_iter()
        .map(|(name, bytes)| FileSpec {
            name: name.into(),
            runs: vec![Run::Bytes(bytes)],
        })
        .collect();
    let tensors = checkpoint::tensor_files(&model.params, opt, Some(&hf::metadata()));
    let manifest_model = serde_json::json!({
        "arch": ARCH,
        "format": "huggingface",
        "training": training,
        "losses": history,
    });
    let dir = &spec.output_dir;
    let (_, written) =
        checkpoint::write_streamed(dir, ahead, tensors, opt.step, manifest_model, released)?;
    Ok(written)
}

/// Figures gathered during the loop.
struct LoopStats {
    earlier: LossHistory,
    first_loss: Option<f64>,
    /// The last [`FINAL_LOSS_STEPS`] losses, on the device (read back at the end only).
    recent: std::collections::VecDeque<tch::Tensor>,
    tokens_after_first: usize,
    after_first: Option<Instant>,
    started: Instant,
    finished: Instant,
    interrupted: bool,
}

impl LoopStats {
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

    fn metrics(&self, history: &LossHistory, steps: u64, n_params: i64) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        if let Some(first) = history.first_loss {
            m.insert("first_loss".into(), first);
        }
        if !history.recent.is_empty() {
            let mean = history.recent.iter().sum::<f64>() / history.recent.len() as f64;
            m.insert("final_loss".into(), mean);
        }
        if let Some(t) = self.after_first {
            let secs = self.finished.duration_since(t).as_secs_f64();
            if self.tokens_after_first > 0 && secs > 0.0 {
                m.insert("tokens_per_s".into(), self.tokens_after_first as f64 / secs);
            }
        }
        m.insert("steps".into(), steps as f64);
        let wall = self.finished.duration_since(self.started).as_secs_f64();
        m.insert("train_wall_s".into(), wall);
        m.insert("parameters".into(), n_params as f64);
        m
    }
}

/// The steps, from the optimizer's step + 1 to `p.steps`; a stop signal ends the loop after
/// the current step. Every `checkpoint_every` steps a resumable checkpoint is written.
#[allow(clippy::too_many_arguments)]
fn train_loop(
    model: &mut Llama,
    opt: &mut AdamW,
    data: &TokenData,
    p: &TrainParams,
    compute: &Compute,
    sink: &mut EventSink,
    source: &Source,
    spec: &StageSpec,
    earlier: LossHistory,
) -> StageResult<LoopStats> {
    let schedule = Schedule {
        peak: p.lr,
        warmup: p.warmup_steps,
        total: p.steps,
    };
    let mut clock = ProgressClock::new(p.progress_every_s);
    let now = Instant::now();
    let mut stats = LoopStats {
        earlier,
        first_loss: None,
        recent: Default::default(),
        tokens_after_first: 0,
        after_first: None,
        started: now,
        finished: now,
        interrupted: false,
    };
    opt.use_kernels(crate::kernels::fused::usable(
        compute.device,
        compute.kind,
        model.config.hidden_size,
    ));
    let first = opt.step + 1;
    let loss_log = std::env::var_os(LOSS_LOG_ENV).filter(|v| !v.is_empty());
    let mut every_loss = Vec::new();
    let mut profile = crate::stages::profile::StepProfile::from_env(first, compute.device)?;
    for step in first..=p.steps {
        if let Some(profile) = profile.as_mut() {
            profile.before_step(step)?;
        }
        let host = data.batch(p.seed, step, p.batch_size as usize, p.seq_len as usize);
        let batch = host.to_device(compute.device);
        model.params.zero_grad();
        let loss = model.loss(&batch.inputs, &batch.targets, compute.kind);
        loss.backward();
        let _grad_norm = opt.step(&mut model.params, schedule.lr(step));
        if let Some(profile) = profile.as_mut() {
            profile.after_step(step, step == p.steps || signals::stop_requested())?;
        }
        let loss = loss.detach();
        if step == first {
            stats.first_loss = Some(loss.double_value(&[]));
            stats.after_first = Some(Instant::now());
            stream::start_planned_pinning();
        } else {
            stats.tokens_after_first += batch.tokens;
        }
        clock.record(&loss, batch.tokens);
        if loss_log.is_some() {
            every_loss.push(loss.shallow_clone());
        }
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
            let state = training_state(p, false);
            let files = write(spec, model, opt, source, &state, &stats.history(), None)?;
            sink.checkpoint_files(files, Some(opt.step));
            crate::log!("periodic checkpoint at step {step}");
        }
    }
    stats.finished = Instant::now();
    if let Some(path) = loss_log {
        let losses: Vec<f64> = every_loss.iter().map(|t| t.double_value(&[])).collect();
        let text = serde_json::json!({"first_step": first, "losses": losses}).to_string();
        std::fs::write(&path, text).map_err(|e| {
            Failure::other(format!("cannot write {}: {e}", Path::new(&path).display()))
        })?;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::config::LlamaConfig;
    use tch::{Device, Kind, Tensor};

    /// The weights file streamed from the flat buffer is byte for byte the one
    /// `hf::safetensors_bytes` makes of the named parameters (the format transformers loads,
    /// which the tests against transformers check), and the optimizer's file restores the
    /// moments and the step.
    #[test]
    fn the_streamed_weights_are_the_hugging_face_files_bytes_and_the_moments_load_back() {
        crate::testutil::one_torch_thread();
        let config = LlamaConfig::parse(
            r#"{"model_type":"llama","vocab_size":50,"hidden_size":32,"intermediate_size":48,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "max_position_embeddings":64}"#,
        )
        .unwrap();
        let model = Llama::zeroed(&config, Device::Cpu);
        let n = model.params.numel();
        let mut opt = AdamW::new(&model.params, 0.1);
        tch::no_grad(|| {
            let values = |k: f64| (Tensor::arange(n, (Kind::Float, Device::Cpu)) * k).sin();
            model.params.flat.shallow_clone().copy_(&values(0.37));
            opt.exp_avg.copy_(&values(0.11));
            opt.exp_avg_sq.copy_(&values(0.05).abs());
        });
        opt.step = 17;
        let dir = crate::testutil::scratch_dir("llama-streamed");
        let files = checkpoint::tensor_files(&model.params, &opt, Some(&hf::metadata()));
        stream::write_files_unsynced(&dir, files, None)
            .unwrap()
            .sync()
            .unwrap();
        let named: Vec<(String, Tensor)> = tch::no_grad(|| {
            model
                .params
                .params
                .iter()
                .map(|p| (p.name.clone(), p.tensor.detach()))
                .collect()
        });
        let streamed = std::fs::read(dir.join(checkpoint::MODEL_FILE)).unwrap();
        assert!(streamed == hf::safetensors_bytes(&named), "other bytes");
        let back = hf::load(
            &{
                let with_config = dir.join("hf");
                std::fs::create_dir_all(&with_config).unwrap();
                std::fs::write(
                    with_config.join(hf::CONFIG_FILE),
                    config.to_json("float32").to_string(),
                )
                .unwrap();
                std::fs::copy(
                    dir.join(checkpoint::MODEL_FILE),
                    with_config.join(hf::WEIGHTS_FILE),
                )
                .unwrap();
                with_config
            },
            Device::Cpu,
        )
        .unwrap();
        assert!(back.params.flat.equal(&model.params.flat));
        let bytes = std::fs::read(dir.join(checkpoint::OPTIMIZER_FILE)).unwrap();
        let tensors = checkpoint::decode_tensors(&bytes, "the optimizer file").unwrap();
        let mut restored = AdamW::new(&back.params, 0.1);
        restored.load(&back.params, &tensors, "test").unwrap();
        assert_eq!(restored.step, 17);
        assert!(restored.exp_avg.equal(&opt.exp_avg));
        assert!(restored.exp_avg_sq.equal(&opt.exp_avg_sq));
    }
}

//! The `eval` stage: loss and perplexity of `init`'s checkpoint on held-out data, and on
//! prompt/completion data the exact-match accuracy of greedy decoding.

use crate::boot::signals;
use crate::boot::spec::parse_params;
use crate::checkpoint;
use crate::data::batch::{fits, pair_rows, round_width, text_windows, HostBatch};
use crate::data::rng::Rng;
use crate::data::{self, Dataset, Example, Split};
use crate::device::{self, Compute};
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use crate::model::ByteGpt;
use protocol::worker::{EvalParams, StageSpec};
use std::collections::BTreeMap;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

use super::RESULTS_FILE;
/// Wrong completions shown on stderr, for a human reading the log.
const MISSES_LOGGED: usize = 5;
/// Seconds between progress events of an evaluation.
const PROGRESS_EVERY_S: f64 = 1.0;

/// Checks the parameters that serde cannot; the message names the parameter.
pub fn validate(p: &EvalParams) -> StageResult<()> {
    if p.samples == 0 {
        return Err(Failure::bad_input("params.samples must be at least 1"));
    }
    if p.batch_size == 0 {
        return Err(Failure::bad_input("params.batch_size must be at least 1"));
    }
    if p.seq_len == 0 {
        return Err(Failure::bad_input("params.seq_len must be at least 1"));
    }
    device::compute_kind(&p.precision, false)?;
    Ok(())
}

/// Greedy completions: for each prompt, the `lens[i]` most likely next bytes, one at a time
/// (fewer if the model's position table runs out). Prompts are decoded together, right-padded;
/// causal attention makes the padding invisible to the positions that are read. Every pass
/// feeds all rows at a width rounded up with [`round_width`], so the device sees few shapes.
pub fn greedy_complete(
    model: &ByteGpt,
    prompts: &[&[u8]],
    lens: &[usize],
    compute: &Compute,
) -> Vec<Vec<u8>> {
    let max_len = model.config.max_seq_len as usize;
    let mut rows: Vec<Vec<u8>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); prompts.len()];
    let n = rows.len();
    tch::no_grad(|| loop {
        let live: Vec<usize> = (0..n)
            .filter(|&i| out[i].len() < lens[i] && !rows[i].is_empty() && rows[i].len() <= max_len)
            .collect();
        if live.is_empty() {
            break;
        }
        let longest = live.iter().map(|&i| rows[i].len()).max().unwrap_or(1);
        let width = round_width(longest, max_len);
        let mut ids = vec![0i64; n * width];
        let mut last = vec![0i64; n];
        for (r, row) in rows.iter().enumerate() {
            let used = row.len().min(width);
            for (c, &b) in row[..used].iter().enumerate() {
                ids[r * width + c] = i64::from(b);
            }
            last[r] = used.max(1) as i64 - 1;
        }
        let ids = Tensor::from_slice(&ids)
            .view([n as i64, width as i64])
            .to_device(compute.device);
        let logits = model.forward(&ids, compute.kind);
        let pos = Tensor::from_slice(&last).to_device(compute.device);
        let rows_idx = Tensor::arange(n as i64, (Kind::Int64, compute.device));
        let picked = logits
            .index(&[Some(rows_idx), Some(pos)])
            .argmax(-1, false)
            .to_device(Device::Cpu);
        let next: Vec<i64> = Vec::<i64>::try_from(&picked).expect("argmax gives int64");
        for &i in &live {
            out[i].push(next[i] as u8);
            rows[i].push(next[i] as u8);
        }
    });
    out
}

/// Mean cross-entropy over the scored positions of `batches`, weighting each batch by how many
/// positions it scores.
fn mean_loss(model: &ByteGpt, batches: &[HostBatch], compute: &Compute) -> f64 {
    let mut total = 0.0;
    let mut count = 0usize;
    tch::no_grad(|| {
        for b in batches {
            let n = b.scored();
            if n == 0 {
                continue;
            }
            let d = b.to_device(compute.device);
            let loss = model.loss(&d.inputs, &d.targets, compute.kind);
            total += loss.double_value(&[]) * n as f64;
            count += n;
        }
    });
    total / count.max(1) as f64
}

/// Runs the `eval` stage of `spec`, reporting on `sink`.
pub fn run(spec: &StageSpec, sink: &mut EventSink) -> StageResult<()> {
    let p: EvalParams = parse_params(spec)?;
    validate(&p)?;
    let Some(init) = spec.init.as_deref() else {
        return Err(Failure::bad_input(format!(
            "eval stage `{}` has no `init`: name the stage whose checkpoint it evaluates",
            spec.stage
        )));
    };
    let compute = device::prepare(spec.device, &p.precision)?;
    crate::log!("stage `{}`: eval on {}", spec.stage, compute.description);
    sink.started(&compute.description);

    crate::checkpoint::input_wait::await_input(spec, init)?;
    if crate::checkpoint::hf::is_hf_dir(init) {
        return crate::stages::llama::eval::run(spec, init, &compute, sink);
    }
    let verified = checkpoint::open_for_weights(init)?;
    let config = verified.model_config()?;
    let seq_len = p.seq_len as usize;
    if seq_len as i64 > config.max_seq_len {
        return Err(Failure::bad_input(format!(
            "params.seq_len ({seq_len}) exceeds the checkpoint's max_seq_len ({})",
            config.max_seq_len
        )));
    }
    let model = ByteGpt::new(&config, compute.device, 0);
    verified.load_model(&model)?;
    let data = data::load(&p.data, p.seed, Split::HeldOut, p.samples as usize)?;
    crate::log!(
        "evaluating {} (step {:?}) on `{}`: {}",
        init.display(),
        verified.manifest.step,
        p.data,
        data.describe()
    );
    let started = Instant::now();
    let mut metrics = match &data {
        Dataset::Text(text) => eval_text(&model, text, &p, &compute, sink)?,
        Dataset::Pairs(pairs) => eval_pairs(&model, pairs, &p, &compute, sink)?,
    };
    metrics.insert("eval_wall_s".into(), started.elapsed().as_secs_f64());
    crate::log!("metrics {metrics:?}");
    let results = serde_json::json!({
        "v": protocol::PROTOCOL_VERSION,
        "stage": spec.stage,
        "checkpoint": init,
        "checkpoint_step": verified.manifest.step,
        "data": p.data,
        "metrics": metrics,
    });
    let mut bytes = serde_json::to_vec_pretty(&results).expect("results serialize");
    bytes.push(b'\n');
    let (_, files) = checkpoint::write_with_manifest(
        &spec.output_dir,
        vec![(RESULTS_FILE, bytes)],
        verified.manifest.step,
        verified.manifest.model.clone(),
    )?;
    sink.checkpoint_files(files, verified.manifest.step);
    sink.metrics(&metrics);
    Ok(())
}

fn check_stop() -> StageResult<()> {
    if signals::stop_requested() {
        Err(Failure::interrupted(
            "stopped by a signal during evaluation",
        ))
    } else {
        Ok(())
    }
}

fn loss_metrics(loss: f64, samples: usize) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    m.insert("loss".into(), loss);
    m.insert("perplexity".into(), loss.exp());
    m.insert("samples".into(), samples as f64);
    m
}

fn eval_text(
    model: &ByteGpt,
    text: &[u8],
    p: &EvalParams,
    compute: &Compute,
    sink: &mut EventSink,
) -> StageResult<BTreeMap<String, f64>> {
    let seq_len = p.seq_len as usize;
    if text.len() < seq_len + 1 {
        return Err(Failure::bad_input(format!(
            "params.data `{}` has {} bytes; seq_len {seq_len} needs at least {}",
            p.data,
            text.len(),
            seq_len + 1
        )));
    }
    let mut rng = Rng::new(p.seed);
    let samples = p.samples as usize;
    let starts: Vec<usize> = (0..samples)
        .map(|_| rng.below(text.len() - seq_len))
        .collect();
    let mut batches = Vec::new();
    for chunk in starts.chunks(p.batch_size as usize) {
        batches.push(text_windows(text, chunk, seq_len));
    }
    check_stop()?;
    let loss = mean_loss(model, &batches, compute);
    sink.progress(samples as u64, samples as u64, Some(loss), None);
    Ok(loss_metrics(loss, samples))
}

fn eval_pairs(
    model: &ByteGpt,
    pairs: &[Example],
    p: &EvalParams,
    compute: &Compute,
    sink: &mut EventSink,
) -> StageResult<BTreeMap<String, f64>> {
    let seq_len = p.seq_len as usize;
    let asked = p.samples as usize;
    let mut skipped = 0usize;
    let usable: Vec<&Example> = pairs
        .iter()
        .filter(|e| {
            let fit = fits(e, seq_len);
            skipped += usize::from(!fit);
            fit
        })
        .take(asked)
        .collect();
    if usable.is_empty() {
        return Err(Failure::bad_input(format!(
            "params.data `{}`: no example has a prompt of at most seq_len = {seq_len} bytes",
            p.data
        )));
    }
    let total = usable.len();
    if skipped > 0 || total < asked {
        crate::log!(
            "evaluating {total} of the {asked} examples asked: {skipped} skipped, their prompt does not fit in seq_len {seq_len}{}",
            if total < asked { "; the data has no more that fit" } else { "" }
        );
    }
    let batch = p.batch_size as usize;
    let batches: Vec<HostBatch> = usable
        .chunks(batch)
        .map(|c| pair_rows(c, seq_len))
        .collect();
    check_stop()?;
    let loss = mean_loss(model, &batches, compute);

    let mut correct = 0usize;
    let mut misses_logged = 0usize;
    let mut done = 0usize;
    let mut last_report = Instant::now();
    for chunk in usable.chunks(batch) {
        check_stop()?;
        let prompts: Vec<&[u8]> = chunk.iter().map(|e| e.prompt.as_slice()).collect();
        let lens: Vec<usize> = chunk.iter().map(|e| e.completion.len()).collect();
        let outs = greedy_complete(model, &prompts, &lens, compute);
        for (e, o) in chunk.iter().zip(&outs) {
            if e.completion == *o {
                correct += 1;
            } else if misses_logged < MISSES_LOGGED {
                misses_logged += 1;
                crate::log!(
                    "miss: {:?} → {:?} (expected {:?})",
                    String::from_utf8_lossy(&e.prompt),
                    String::from_utf8_lossy(o),
                    String::from_utf8_lossy(&e.completion)
                );
            }
        }
        done += chunk.len();
        if last_report.elapsed().as_secs_f64() >= PROGRESS_EVERY_S || done == total {
            sink.progress(done as u64, total as u64, Some(loss), None);
            last_report = Instant::now();
        }
    }
    let mut m = loss_metrics(loss, total);
    m.insert("accuracy".into(), correct as f64 / total as f64);
    m.insert("skipped".into(), skipped as f64);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::worker::ModelConfig;

    #[test]
    fn greedy_decoding_matches_one_at_a_time_decoding() {
        crate::testutil::one_torch_thread();
        let config = ModelConfig {
            d_model: 32,
            n_layers: 1,
            n_heads: 2,
            max_seq_len: 32,
        };
        let model = ByteGpt::new(&config, Device::Cpu, 5);
        let compute = Compute {
            device: Device::Cpu,
            kind: Kind::Float,
            description: "cpu".into(),
            driver_ready_at: None,
        };
        let prompts: Vec<&[u8]> = vec![b"upper: cat\n", b"hi", b"upper: red fox\n"];
        let lens = vec![4, 6, 8];
        let together = greedy_complete(&model, &prompts, &lens, &compute);
        for (i, p) in prompts.iter().enumerate() {
            let alone = greedy_complete(&model, &[p], &lens[i..=i], &compute);
            assert_eq!(alone[0], together[i], "prompt {i}");
            assert_eq!(together[i].len(), lens[i]);
        }
    }
}

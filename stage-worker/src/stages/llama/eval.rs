//! The `eval` stage of a Llama model: loss and perplexity of the Hugging Face model `init`
//! names on a local file, and on prompt/completion data the share of examples whose every
//! completion token is the model's most likely next token given the true prefix
//! (teacher-forced exact match).

use super::data::{self, pair_row, TokenData, Tokens};
use crate::boot::spec::parse_params;
use crate::checkpoint;
use crate::checkpoint::hf;
use crate::data::batch::{HostBatch, IGNORE};
use crate::data::rng::Rng;
use crate::device::Compute;
use crate::events::EventSink;
use crate::failure::{Failure, StageResult};
use crate::model::llama::{cross_entropy, Llama};
use crate::stages::RESULTS_FILE;
use protocol::worker::{EvalParams, StageSpec};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;
use tch::{Kind, Tensor};

/// The rows to score: `samples` windows of a text (drawn from `seed`), or the first `samples`
/// examples whose prompt fits.
fn rows(data: &TokenData, p: &EvalParams) -> Vec<(Vec<i64>, Vec<i64>)> {
    let seq_len = p.seq_len as usize;
    match data {
        TokenData::Text(t) => {
            let mut rng = Rng::new(p.seed);
            (0..p.samples)
                .map(|_| {
                    let s = rng.below(t.len() - seq_len);
                    (
                        t[s..s + seq_len].to_vec(),
                        t[s + 1..s + seq_len + 1].to_vec(),
                    )
                })
                .collect()
        }
        TokenData::Pairs(pairs) => pairs
            .iter()
            .filter_map(|(a, c)| pair_row(a, c, seq_len))
            .take(p.samples as usize)
            .collect(),
    }
}

/// Mean loss over every scored position of `rows`, and how many rows had every scored
/// position predicted exactly.
fn score(
    model: &Llama,
    rows: &[(Vec<i64>, Vec<i64>)],
    p: &EvalParams,
    compute: &Compute,
) -> (f64, usize) {
    let (mut total, mut count, mut exact) = (0.0, 0usize, 0usize);
    tch::no_grad(|| {
        for chunk in rows.chunks(p.batch_size as usize) {
            let b = HostBatch {
                inputs: chunk.iter().flat_map(|r| r.0.clone()).collect(),
                targets: chunk.iter().flat_map(|r| r.1.clone()).collect(),
                rows: chunk.len(),
                cols: p.seq_len as usize,
            };
            let n = b.scored();
            let d = b.to_device(compute.device);
            let logits = model.forward(&d.inputs, compute.kind);
            total += cross_entropy(&logits, &d.targets).double_value(&[]) * n as f64;
            count += n;
            let scored = d.targets.ne(IGNORE);
            let wrong = logits
                .argmax(-1, false)
                .ne_tensor(&d.targets)
                .logical_and(&scored);
            let wrong_rows = wrong.sum_dim_intlist(-1, false, Kind::Int64).eq(0);
            exact += wrong_rows.sum(Kind::Int64).int64_value(&[]) as usize;
        }
    });
    (total / count.max(1) as f64, exact)
}

/// Runs the `eval` stage of `spec` on the Llama model in `init`, reporting on `sink`.
pub fn run(
    spec: &StageSpec,
    init: &Path,
    compute: &Compute,
    sink: &mut EventSink,
) -> StageResult<()> {
    let p: EvalParams = parse_params(spec)?;
    let config = hf::read_config(init).map_err(Failure::bad_input)?;
    if i64::from(p.seq_len) > config.max_position_embeddings {
        return Err(Failure::bad_input(format!(
            "params.seq_len ({}) exceeds the model's max_position_embeddings ({})",
            p.seq_len, config.max_position_embeddings
        )));
    }
    let tokens = Tokens::open(init, &config.raw)?;
    let data = data::load(&p.data, &tokens)?;
    data.check(p.seq_len as usize)
        .map_err(|e| Failure::bad_input(format!("params.data `{}`: {e}", p.data)))?;
    let (model, step) = super::load_checked(init, compute.device)?;
    crate::log!(
        "evaluating the Llama model in {} on `{}`: {}",
        init.display(),
        p.data,
        data.describe()
    );
    let started = Instant::now();
    let rows = rows(&data, &p);
    let (loss, exact) = score(&model, &rows, &p, compute);
    sink.progress(rows.len() as u64, rows.len() as u64, Some(loss), None);
    let mut metrics = BTreeMap::new();
    metrics.insert("loss".to_string(), loss);
    metrics.insert("perplexity".into(), loss.exp());
    metrics.insert("samples".into(), rows.len() as f64);
    if matches!(data, TokenData::Pairs(_)) {
        metrics.insert("accuracy".into(), exact as f64 / rows.len().max(1) as f64);
    }
    metrics.insert("eval_wall_s".into(), started.elapsed().as_secs_f64());
    crate::log!("metrics {metrics:?}");
    let results = serde_json::json!({
        "v": protocol::PROTOCOL_VERSION,
        "stage": spec.stage,
        "checkpoint": init,
        "checkpoint_step": step,
        "data": p.data,
        "metrics": metrics,
    });
    let mut bytes = serde_json::to_vec_pretty(&results).expect("results serialize");
    bytes.push(b'\n');
    let model_json =
        serde_json::json!({"arch": crate::model::llama::ARCH, "format": "huggingface"});
    let (_, files) = checkpoint::write_with_manifest(
        &spec.output_dir,
        vec![(RESULTS_FILE, bytes)],
        step,
        model_json,
    )?;
    sink.checkpoint_files(files, step);
    sink.metrics(&metrics);
    Ok(())
}

/// The logits (fp32 `[rows, time, vocab]`) of the model in `dir` for `ids`, computed on the
/// CPU in fp32: what `stage-worker llama-logits` writes.
pub fn logits(dir: &Path, ids: &[Vec<i64>]) -> Result<Tensor, String> {
    let model = hf::load(dir, tch::Device::Cpu)?;
    let width = ids.first().map_or(0, Vec::len);
    if width == 0 || ids.iter().any(|r| r.len() != width) {
        return Err("the rows of ids must be non-empty and equally long".into());
    }
    let flat: Vec<i64> = ids.concat();
    let t = Tensor::from_slice(&flat).view([ids.len() as i64, width as i64]);
    Ok(tch::no_grad(|| model.forward(&t, Kind::Float)))
}

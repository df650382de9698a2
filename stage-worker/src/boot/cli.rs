//! Command-line interface.

use clap::Parser;
use std::path::PathBuf;

const LONG_ABOUT: &str = "\
Runs one built-in stage of an orchestrate pipeline and exits: trains a byte-level transformer \
language model (from scratch or from an upstream checkpoint) or evaluates a checkpoint. \
The orchestrator starts it once per stage, in a fresh process, so every byte of GPU memory \
the stage used goes back to the system when it exits.";

const AFTER_HELP: &str = "\
STAGE SPEC (JSON, protocol version 1; written by orchestrate)
  kind        \"train\" or \"eval\"
  params      the stage's parameters (below); unknown keys are refused
  init        checkpoint directory to start from (train) or to evaluate (eval, required)
  output_dir  where a train stage writes its checkpoint
  device      \"cuda\" (device 0 of CUDA_VISIBLE_DEVICES) or \"cpu\"
  inputs_being_written  input directories still being written by their stage (an early
              start): each is read once its manifest.json is there (looked for every 5 ms,
              after start-up), at most input_wait_limit_s seconds when that is set

TRAIN PARAMS (defaults)
  data = \"synthetic:pretrain\"  also \"synthetic:sft\", a text file, or a .jsonl file of
                               {\"prompt\": ..., \"completion\": ...} lines (paths relative
                               to the working directory)
  steps = 200, batch_size = 16, seq_len = 64, lr = 3e-3, warmup_steps = 20,
  weight_decay = 0.01, seed = 0, progress_every_s = 1.0, precision = \"auto\",
  checkpoint_every = 0 (also save a resumable checkpoint every N steps)
  model = { d_model = 128, n_layers = 2, n_heads = 4, max_seq_len = 256 }
                               (ignored with init: the checkpoint's shape is used)
  AdamW (betas 0.9/0.95), linear warm-up then cosine decay to 10% of lr, grad norm
  clipped at 1.0. precision \"auto\" is bf16 on CUDA and fp32 on the CPU.

EVAL PARAMS (defaults)
  data = \"synthetic:sft\", samples = 200, batch_size = 64, seq_len = 64,
  seed = 1000003, precision = \"auto\"
  Held-out synthetic examples never occur in training. Metrics: loss, perplexity,
  samples, and on prompt/completion data accuracy (exact match of greedy decoding).

LLAMA MODELS
  When init is a Hugging Face directory (it has config.json; model_type \"llama\"), train
  and eval run that model: weights from model.safetensors (or its shards), the tokenizer
  from tokenizer.json, data from a .jsonl of {\"text\": ...} lines (pretraining) or
  {\"prompt\", \"completion\"} lines (SFT: the prompt masked from the loss); params.model
  is ignored. A train stage writes a Hugging Face directory (model.safetensors under
  transformers' names, config.json, the tokenizer's files) plus optimizer.safetensors and
  manifest.json; eval's accuracy is teacher-forced exact match of the completion.
  `stage-worker llama-logits --model DIR --ids 1,2,3 --out FILE` writes the model's fp32
  CPU logits for those ids.

OUTPUT (train)
  model.safetensors      fp32 weights
  optimizer.safetensors  AdamW moments (exp_avg.*, exp_avg_sq.*) and step
  manifest.json          sizes and BLAKE3 checksums of both, step, model shape; written last
OUTPUT (eval)
  metrics.json           the metrics, the checkpoint evaluated and its step
  manifest.json          size and BLAKE3 checksum of metrics.json; written last
  Every file is put in place atomically (a temporary file renamed), the manifest last, and
  all of them are fsynced, with the directory, before the stage reports done. A train
  checkpoint's files are written to the page cache at full speed (each chunk at its offset;
  a thread of its own starts their write-back behind the writers) and are in place, with the
  manifest, before the fsyncs, so a stage started early reads them from the page cache; it
  reads model.safetensors as soon as that file is in place, and uses those bytes only if the
  manifest then lists that very file. Checkpoints read as input are verified against their
  manifest before use.

TUNING (environment)
  STAGE_WORKER_SDPA     attention kernels: auto (default: cuDNN's from 200 planned steps,
                        a Llama's counted by their attention work, memory-efficient below,
                        flash for grouped-query attention), efficient, flash, libtorch
  STAGE_WORKER_FUSED    auto (default: on CUDA in bf16, the block's residual add, LayerNorm and
                        cast as one kernel each way, linear layers that hand the fp32
                        weights their gradients directly, the embedding, the cross-entropy
                        and the AdamW step as the worker's own kernels, for a Llama also
                        RMSNorm, the rotary embedding and SwiGLU; `check-kernels` tests
                        them), off
  STAGE_WORKER_KERNEL_CACHE
                        where those kernels are kept once compiled (default
                        $XDG_CACHE_HOME/stage-worker/kernels or ~/.cache/stage-worker/kernels)
  STAGE_WORKER_PROFILE  a path: a Chrome trace of a few training steps from libtorch's
                        profiler (STAGE_WORKER_PROFILE_SKIP, default 2; _STEPS, default 3)
  STAGE_WORKER_WRITEBACK
                        who starts a checkpoint's write-back to the disk: behind (default: a
                        thread behind the writers), inline (each writer after each write, as
                        before), fsync (only the final fsync)
  STAGE_WORKER_WRITERS  writer threads per checkpoint file, 1 (default) to 16
  STAGE_WORKER_LOSS_LOG a path: a Llama train stage writes every step's loss there as JSON

EVENTS
  One JSON object per line ({\"v\": 1, \"event\": ...}) to the Unix socket named by
  ORCHESTRATE_EVENTS, or to stdout when it is unset: started, progress, checkpoint,
  metrics, then done or failed; released (with downstream_may_start) once the final
  checkpoint is on the host and the CUDA context destroyed. Human-readable logs go to stderr.
  STAGE_WORKER_SIMULATED_CUDA=<ms> (tests without a GPU): a \"cuda\" stage computes on the
  CPU, releases as on CUDA, and writes its manifest <ms> milliseconds after the release.

SIGNALS
  SIGTERM or SIGINT during training: the current step finishes, a resumable checkpoint is
  written, and the process exits 75. A retried train stage whose output directory holds
  such a checkpoint of the same run resumes from it.

EXIT STATUS
  0 done; 65 unusable inputs or parameters (bad_input); 66 CUDA out of memory (cuda_oom);
  75 interrupted by a signal (interrupted); 1 any other error; 2 bad command line.";

/// `stage-worker [--spec PATH]` or `stage-worker hold …`.
#[derive(Debug, Parser)]
#[command(
    name = "stage-worker",
    version,
    about = "Runs one built-in training or evaluation stage (tch/libtorch) and exits.",
    long_about = LONG_ABOUT,
    after_long_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The stage spec (JSON) to run; defaults to $ORCHESTRATE_SPEC.
    #[arg(long, value_name = "PATH", env = protocol::worker::ENV_SPEC)]
    pub spec: Option<PathBuf>,
    /// A tool instead of a stage.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Tools other than running a stage.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Take GPU memory on cuda:0, hold it, exit: a fixture for benchmarks and leak tests.
    Hold(crate::boot::hold::HoldArgs),
    /// Check the fused LayerNorm kernels against libtorch's on this machine's GPU (values and
    /// speed, one JSON object per line); exit 1 if they differ beyond rounding.
    #[command(name = "check-kernels")]
    CheckKernels,
    /// Writes the fp32 CPU logits of a Llama model in Hugging Face format for given token ids
    /// (to compare the worker's computation with transformers').
    #[command(name = "llama-logits")]
    LlamaLogits(LlamaLogitsArgs),
    /// Serve forks of fresh workers to orchestrate (started by orchestrate itself).
    #[command(name = "fork-server", hide = true)]
    ForkServer(ForkServerArgs),
}

/// Arguments of `stage-worker fork-server`.
/// Arguments of `stage-worker llama-logits`.
#[derive(Debug, clap::Args)]
pub struct LlamaLogitsArgs {
    /// The model's directory (config.json, model.safetensors).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Token ids: rows separated by `;`, ids by `,` (rows equally long).
    #[arg(long)]
    pub ids: String,
    /// Where to write the logits (a safetensors file with one tensor, `logits`).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct ForkServerArgs {
    /// The inherited Unix socket to serve on.
    #[arg(long)]
    pub fd: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed_and_takes_a_spec() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["stage-worker", "--spec", "/tmp/s.json"]).unwrap();
        assert_eq!(cli.spec, Some(PathBuf::from("/tmp/s.json")));
        let cli = Cli::try_parse_from(["stage-worker", "hold", "--gib", "1.5"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Hold(ref h)) if h.gib == 1.5));
    }
}

//! The Llama quickstart end to end on the CPU (configs/quickstart-llama.toml, as shipped): a
//! Python stage builds a tiny Llama and its tokenizer with transformers, the built-in worker
//! pretrains and fine-tunes it, each stage starting from its upstream's Hugging Face
//! directory, and the fine-tuned model, which transformers loads, solves held-out examples the
//! pretrained one cannot.
//!
//! The Python is `ORCHESTRATE_TEST_PYTHON` (torch, transformers, tokenizers); under CI
//! (`CI=true`) a missing one fails the test, elsewhere `.venv-frameworks/` is tried and the
//! test is skipped without it.

use e2e_tests::{framework_python, orchestrate_with, repo_root, run_plan_with, Scratch};
use std::process::Command;

#[test]
fn the_llama_quickstart_pretrains_and_fine_tunes_a_model_transformers_loads() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("llama-quickstart");
    let plan = repo_root().join("configs/quickstart-llama.toml");
    let run = run_plan_with(orchestrate_with(&python), &s, &plan, &[]);
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    for stage in ["base", "pretrain", "sft", "eval", "eval-pretrain"] {
        assert_eq!(run.stage(stage)["status"], "succeeded", "{stage}");
    }
    // Each built-in stage started from its upstream's Hugging Face directory.
    for (stage, init) in [("pretrain", "base"), ("sft", "pretrain"), ("eval", "sft")] {
        let spec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(run.run_dir.join(format!("stages/{stage}/spec.json")))
                .unwrap(),
        )
        .unwrap();
        let from = spec["init"].as_str().unwrap();
        assert!(
            from.ends_with(&format!("stages/{init}/output")),
            "{stage}: {from}"
        );
    }
    assert!(run.metric("pretrain", "final_loss") < run.metric("pretrain", "first_loss") - 2.0);
    let (after_sft, pretrain_only) = (
        run.metric("eval", "accuracy"),
        run.metric("eval-pretrain", "accuracy"),
    );
    eprintln!("held-out accuracy: after SFT {after_sft:.3}, pretrain only {pretrain_only:.3}");
    assert!(
        after_sft >= pretrain_only + 0.2,
        "after SFT {after_sft}, pretrain only {pretrain_only}"
    );
    assert!(run.metric("eval", "loss") < run.metric("eval-pretrain", "loss"));

    // transformers loads the fine-tuned model and its tokenizer from the stage's output.
    let sft = run.run_dir.join("stages/sft/output");
    let script = "import sys, torch\n\
from transformers import AutoModelForCausalLM, AutoTokenizer\n\
m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1])\n\
ids = t('upper: red fox\\n', return_tensors='pt').input_ids\n\
out = m.generate(ids, max_new_tokens=6, do_sample=False)\n\
print(repr(t.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))\n";
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(&sft)
        .env("OMP_NUM_THREADS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "transformers could not load {}: {}",
        sft.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "transformers' greedy completion: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

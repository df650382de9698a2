//! The built-in pipeline end to end on the CPU: the quickstart plan (pretrain → SFT → eval),
//! each stage a fresh `stage-worker` process, checkpoints handed downstream and verified.

use e2e_tests::{processes_with_env, repo_root, run_plan, Scratch};

#[test]
fn quickstart_succeeds_and_sft_really_starts_from_pretrain() {
    let s = Scratch::new("quickstart");
    let marker = format!("quickstart-{}", std::process::id());
    let quickstart = std::fs::read_to_string(repo_root().join("configs/quickstart.toml")).unwrap();
    // The quickstart as shipped, plus one SFT stage from scratch to compare first losses with.
    let plan = s.write(
        "plan.toml",
        &format!(
            "{quickstart}\n[[stage]]\nname = \"sft-scratch\"\nkind = \"train\"\n[stage.env]\nMARKER = \"{marker}\"\n[stage.params]\ndata = \"synthetic:sft\"\nsteps = 1\nseed = 2\n"
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    for stage in ["pretrain", "sft", "eval", "eval-pretrain", "sft-scratch"] {
        assert_eq!(run.stage(stage)["status"], "succeeded", "{stage}");
        assert_eq!(run.stage(stage)["attempts"], 1, "{stage}");
    }

    // SFT starts from pretrain's weights: its very first loss is far below a from-scratch start.
    let from_pretrain = run.metric("sft", "first_loss");
    let from_scratch = run.metric("sft-scratch", "first_loss");
    eprintln!(
        "first-step SFT loss: from pretrain {from_pretrain:.4}, from scratch {from_scratch:.4}"
    );
    assert!(
        from_pretrain < 0.6 * from_scratch,
        "SFT from pretrain starts at {from_pretrain}, from scratch at {from_scratch}"
    );

    // Eval after SFT beats eval of the pretrain checkpoint on the SFT task.
    let after_sft = run.metric("eval", "accuracy");
    let pretrain_only = run.metric("eval-pretrain", "accuracy");
    eprintln!("SFT-task accuracy: after SFT {after_sft:.3}, pretrain only {pretrain_only:.3}");
    assert!(
        after_sft >= pretrain_only + 0.2,
        "after SFT {after_sft}, pretrain {pretrain_only}"
    );
    assert!(run.metric("eval", "loss") < run.metric("eval-pretrain", "loss"));

    // Checkpoints are recorded with checksums and exist where the report says.
    for stage in ["pretrain", "sft"] {
        let checkpoints = run.stage(stage)["checkpoints"].as_array().unwrap().clone();
        assert!(
            checkpoints
                .iter()
                .any(|c| c["path"].as_str().unwrap().ends_with("model.safetensors")),
            "{stage}: {checkpoints:?}"
        );
        for c in &checkpoints {
            let path = std::path::Path::new(c["path"].as_str().unwrap());
            assert_eq!(
                std::fs::metadata(path).unwrap().len(),
                c["bytes"].as_u64().unwrap()
            );
            // Checksums are BLAKE3 (manifest version 2), hex.
            assert_eq!(c["blake3"].as_str().unwrap().len(), 64);
            assert!(c.get("sha256").is_none(), "{c}");
        }
    }
    // The worker told the orchestrator where it started from.
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.run_dir.join("stages/sft/spec.json")).unwrap(),
    )
    .unwrap();
    assert!(spec["init"]
        .as_str()
        .unwrap()
        .ends_with("stages/pretrain/output"));
    assert!(processes_with_env(&format!("MARKER={marker}")).is_empty());
}

#[test]
fn a_checkpoint_changed_after_verification_stops_its_dependent() {
    let s = Scratch::new("corrupt-input");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "train"
kind = "train"
[stage.params]
steps = 2
batch_size = 2
seq_len = 16
model = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }

[[stage]]
name = "vandal"
after = ["train"]
command = ["sh", "-c", "truncate -s 100 {input.train}/model.safetensors"]

[[stage]]
name = "eval"
kind = "eval"
after = ["vandal", "train"]
init = "train"
[stage.params]
samples = 4
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stage("train")["status"], "succeeded");
    let eval = run.stage("eval");
    assert_eq!(eval["status"], "failed");
    assert_eq!(eval["failure"], "bad_input");
    let error = eval["error"].as_str().unwrap();
    assert!(
        error.contains("model.safetensors") && error.contains("train"),
        "{error}"
    );
}

#[test]
fn built_in_cpu_stages_side_by_side_share_the_cores() {
    let s = Scratch::new("threads");
    let tiny = "[stage.params]\nsteps = 2\nbatch_size = 2\nseq_len = 16\nmodel = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }\n";
    let plan = s.write(
        "plan.toml",
        &format!("[run]\nmax_parallel = 2\n[[stage]]\nname = \"a\"\nkind = \"train\"\n{tiny}[[stage]]\nname = \"b\"\nkind = \"train\"\n{tiny}"),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    if std::env::var_os("OMP_NUM_THREADS").is_some() {
        return; // the user's setting wins; nothing to check
    }
    let cpus = std::thread::available_parallelism().unwrap().get();
    // The first stage launched sees both ready (2 sharing); so does the second.
    let expected = (cpus / 2).max(1);
    for stage in ["a", "b"] {
        let log = std::fs::read_to_string(run.run_dir.join(format!("stages/{stage}/stderr.log")))
            .unwrap();
        assert!(
            log.contains(&format!("{expected} threads")),
            "{stage}: {log}"
        );
    }
}

#[test]
fn eval_says_how_many_examples_it_skipped_for_seq_len() {
    let s = Scratch::new("eval-skipped");
    let mut pairs = String::new();
    for i in 0..10 {
        // Every other prompt is longer than seq_len.
        let prompt = if i % 2 == 0 {
            "q".repeat(40)
        } else {
            format!("q{i}")
        };
        pairs.push_str(&format!(
            "{{\"prompt\": \"{prompt}\", \"completion\": \"a\"}}\n"
        ));
    }
    s.write("pairs.jsonl", &pairs);
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "train"
kind = "train"
[stage.params]
steps = 2
batch_size = 2
seq_len = 16
model = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }

[[stage]]
name = "eval"
kind = "eval"
after = ["train"]
init = "train"
[stage.params]
data = "pairs.jsonl"
seq_len = 16
samples = 8
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.metric("eval", "samples"), 5.0);
    assert_eq!(run.metric("eval", "skipped"), 5.0);
    let log =
        std::fs::read_to_string(run.run_dir.join("stages/eval/stderr.log")).unwrap_or_default();
    assert!(
        log.contains("evaluating 5 of the 8 examples asked: 5 skipped, their prompt does not fit in seq_len 16"),
        "{log}"
    );
    // The final table, and `report`'s, give each kind's headline metrics first and count the
    // rest: train its final loss and throughput, eval its accuracy and loss.
    let report = std::process::Command::new(e2e_tests::orchestrate())
        .arg("report")
        .arg(&run.run_dir)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    for table in [&run.stderr, &report] {
        let row = |name: &str| {
            let prefix = format!("{name} ");
            let line = table.lines().rev().find(|l| l.starts_with(&prefix));
            line.unwrap_or_else(|| panic!("{name} in {table}"))
                .to_string()
        };
        let (train, eval) = (row("train"), row("eval"));
        let after_wall = |r: &str| r.split_once("s  ").map(|(_, rest)| rest.to_string());
        let train = after_wall(&train).unwrap();
        assert!(
            train.starts_with("final_loss=") && train.contains(" tokens_per_s="),
            "{train}"
        );
        assert!(
            train.ends_with("more in report.json)") && !train.contains("first_loss"),
            "{train}"
        );
        let eval = after_wall(&eval).unwrap();
        assert!(
            eval.starts_with("accuracy=") && eval.contains(" loss="),
            "{eval}"
        );
        assert!(!eval.contains("perplexity"), "{eval}");
    }
}

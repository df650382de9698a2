//! Hand-over: while one stage runs alone, the stage that will start when it ends is planned
//! ahead and started by the ending stage's own task (`orchestrator::attempt::handover`), at the point
//! where the runner would have started it: the next ready stage once the slot is free (the
//! tree gone), a chain's next stage once its upstream succeeded; never after a failure.

use e2e_tests::Scratch;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const HANDED: &str = "started by the stage before it as it ended (hand-over)";

struct Logged {
    code: Option<i32>,
    run_dir: PathBuf,
    /// JSON log lines.
    lines: Vec<Value>,
}

impl Logged {
    /// The stages started by a hand-over, with its kind, in order.
    fn handed(&self) -> Vec<(String, String)> {
        self.lines
            .iter()
            .filter(|l| l["fields"]["message"] == HANDED)
            .map(|l| {
                (
                    l["span"]["stage"].as_str().unwrap_or("").to_string(),
                    l["fields"]["kind"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    fn journal(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir.join("journal.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn status(&self, stage: &str) -> String {
        let report = e2e_tests::read_report(&self.run_dir);
        e2e_tests::report_stage(&report, stage)["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Runs `plan` with debug logs as JSON.
fn run_logged(s: &Scratch, plan: &Path) -> Logged {
    let run_dir = s.path().join("run");
    let out = Command::new(e2e_tests::orchestrate())
        .arg("--plan")
        .arg(plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    Logged {
        code: out.status.code(),
        run_dir,
        lines: stderr
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    }
}

#[test]
fn a_chain_hands_over_only_after_success_and_records_the_upstream_end_first() {
    let s = Scratch::new("handover-chain");
    let mut plan = String::from("[run]\nmax_parallel = 1\n");
    // c1 → c2 → … → c6, each passing its input on; then a stage that exits 0 without its
    // promised output, and one after it that must never start.
    for i in 1..=6 {
        let (after, read) = if i == 1 {
            (String::new(), "echo 1".to_string())
        } else {
            (
                format!("after = [\"c{}\"]\n", i - 1),
                format!("cat {{input.c{}}}/v", i - 1),
            )
        };
        plan.push_str(&format!(
            "[[stage]]\nname = \"c{i}\"\n{after}command = [\"sh\", \"-c\", \"sleep 0.05; {read} > {{output}}/v\"]\noutputs = [\"v\"]\n"
        ));
    }
    plan.push_str(
        "[[stage]]\nname = \"broken\"\nafter = [\"c6\"]\ncommand = [\"sh\", \"-c\", \"sleep 0.05\"]\noutputs = [\"promised\"]\n\
         [[stage]]\nname = \"never\"\nafter = [\"broken\"]\ncommand = [\"sh\", \"-c\", \"echo ran > {output}/ran\"]\n",
    );
    let plan = s.write("plan.toml", &plan);
    let run = run_logged(&s, &plan);
    assert_eq!(run.code, Some(1), "{:?}", run.lines);
    for i in 1..=6 {
        assert_eq!(run.status(&format!("c{i}")), "succeeded");
    }
    // The value went through every stage, handed over or not.
    assert_eq!(
        std::fs::read_to_string(run.run_dir.join("stages/c6/output/v")).unwrap(),
        "1\n"
    );
    assert_eq!(run.status("broken"), "failed");
    assert_eq!(run.status("never"), "skipped");
    assert!(!run.run_dir.join("stages/never/output/ran").exists());

    let handed = run.handed();
    // The chain's stages after the first few were started by the stage before them (each ran
    // alone for 50 ms, time enough for their files to be written ahead).
    assert!(
        handed.len() >= 3,
        "too few hand-overs: {handed:?} (the feature is not exercised)"
    );
    for (stage, kind) in &handed {
        assert_eq!(kind, "Chain", "{handed:?}");
        assert_ne!(stage, "never", "{handed:?}");
    }
    // The journal has the upstream's end before the start it handed over to, and `never` has
    // no start at all.
    let journal = run.journal();
    let at = |rec: &str, stage: &str| {
        journal
            .iter()
            .position(|r| r["rec"] == rec && r["stage"] == stage)
    };
    for (stage, _) in &handed {
        let upstream = match stage.as_str() {
            "broken" => "c6".to_string(),
            c => format!("c{}", c[1..].parse::<usize>().unwrap() - 1),
        };
        assert!(
            at("stage_finished", &upstream) < at("stage_started", stage),
            "{stage} started before {upstream}'s end was recorded"
        );
    }
    assert_eq!(at("stage_started", "never"), None);
}

#[test]
fn the_next_ready_stage_is_handed_the_slot_once_the_tree_is_gone() {
    let s = Scratch::new("handover-slot");
    let plan = s.write(
        "plan.toml",
        r#"
[run]
max_parallel = 1

[[stage]]
name = "w"
matrix = { n = [1, 2, 3, 4, 5, 6] }
command = ["sh", "-c", "sleep 0.05; echo {matrix.n} > {output}/n"]
outputs = ["n"]
"#,
    );
    let run = run_logged(&s, &plan);
    assert_eq!(run.code, Some(0), "{:?}", run.lines);
    for n in 1..=6 {
        let stage = format!("w[n={n}]");
        assert_eq!(run.status(&stage), "succeeded");
        assert_eq!(
            std::fs::read_to_string(run.run_dir.join(format!("stages/{stage}/output/n"))).unwrap(),
            format!("{n}\n")
        );
    }
    let handed = run.handed();
    assert!(handed.len() >= 3, "too few hand-overs: {handed:?}");
    assert!(handed.iter().all(|(_, kind)| kind == "Slot"), "{handed:?}");
    // One at a time, in order: each start after the previous stage's start.
    let journal = run.journal();
    let starts: Vec<&str> = journal
        .iter()
        .filter(|r| r["rec"] == "stage_started")
        .map(|r| r["stage"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (1..=6).map(|n| format!("w[n={n}]")).collect();
    assert_eq!(starts, expected);
}

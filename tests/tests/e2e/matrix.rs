//! Fan-out stages: a 50-instance matrix, dependencies that follow the matrix, an aggregate
//! stage after all instances, the results table, and fail_fast.

use e2e_tests::{run_plan, Scratch};

#[test]
fn a_50_instance_matrix_with_aligned_dependencies_and_an_aggregate() {
    let s = Scratch::new("matrix");
    let values: Vec<String> = (0..50).map(|i| i.to_string()).collect();
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
max_parallel = 8

[[stage]]
name = "work"
matrix = {{ i = [{list}] }}
command = ["sh", "-c", "test \"$ORCHESTRATE_MATRIX_I\" = {{matrix.i}} && echo {{matrix.i}} > {{output}}/value"]
outputs = ["value"]

[[stage]]
name = "check"
after = ["work"]
matrix = {{ i = [{list}] }}
command = ["sh", "-c", "v=$(cat {{input.work}}/value); echo $((v * 2)) > {{output}}/double; [ $v = {{matrix.i}} ] && printf '{{{{\"v\":1,\"event\":\"metrics\",\"metrics\":{{{{\"double\":%s}}}}}}}}\\n' $((v * 2)) | python3 -c 'import os,socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(os.environ[\"ORCHESTRATE_EVENTS\"]); s.sendall(sys.stdin.buffer.read())'"]
outputs = ["double"]

[[stage]]
name = "total"
after = ["check"]
command = ["sh", "-c", "cat $ORCHESTRATE_RUN_DIR/stages/check*/output/double | awk '{{{{s+=$1}}}} END {{{{print s}}}}' > {{output}}/sum; env | grep -c '^ORCHESTRATE_INPUT_CHECK' > {{output}}/inputs"]
outputs = ["sum"]
"#,
            list = values.join(", ")
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    assert_eq!(
        report["stages"].as_array().unwrap().len(),
        101,
        "50 + 50 instances + 1 aggregate"
    );
    assert_eq!(run.stage("work[i=7]")["status"], "succeeded");
    assert_eq!(run.metric("check[i=7]", "double"), 14.0);
    let read = |p: &str| {
        std::fs::read_to_string(run.run_dir.join(p))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(
        read("stages/total/output/sum"),
        (0..50).map(|i| 2 * i).sum::<i32>().to_string()
    );
    assert_eq!(
        read("stages/total/output/inputs"),
        "50",
        "the aggregate gets every instance as input"
    );
    // Each check ran after its own work instance: the journal orders them.
    let journal = std::fs::read_to_string(run.run_dir.join("journal.jsonl")).unwrap();
    let pos = |needle: &str| journal.find(needle).unwrap_or_else(|| panic!("{needle}"));
    for i in [0, 17, 49] {
        assert!(
            pos(&format!("\"stage_finished\",\"stage\":\"work[i={i}]\""))
                < pos(&format!("\"stage_started\",\"stage\":\"check[i={i}]\""))
        );
    }
    // results.csv: one row per sample, the two matrix stages joined on it.
    let csv = read("results.csv");
    assert_eq!(csv.lines().count(), 51, "a header and one row per sample");
    assert_eq!(
        csv.lines().next().unwrap(),
        "i,work.status,work.error,check.status,check.error,check.double",
        "{csv}"
    );
    assert!(
        csv.lines().any(|l| l == "7,succeeded,,succeeded,,14"),
        "a whole number is written as one: {csv}"
    );
    let json: serde_json::Value = serde_json::from_str(&read("results.json")).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 100);
}

#[test]
fn failed_instances_are_listed_and_fail_fast_stops_the_rest() {
    for fail_fast in [false, true] {
        let s = Scratch::new("matrix-fail");
        let plan = s.write(
            "plan.toml",
            &format!(
                "[run]\nmax_parallel = 1\nfail_fast = {fail_fast}\n[[stage]]\nname = \"job\"\nmatrix = {{ n = [1, 2, 3, 4] }}\ncommand = [\"sh\", \"-c\", \"test {{matrix.n}} -ne 2\"]\n"
            ),
        );
        let run = run_plan(&s, &plan, &[]);
        assert_eq!(run.code, Some(1), "{}", run.stderr);
        assert_eq!(run.stage("job[n=2]")["failure"], "exit_code");
        let csv = std::fs::read_to_string(run.run_dir.join("results.csv")).unwrap();
        assert!(
            csv.lines().any(|l| l == "2,failed,exited with code 1"),
            "one matrix stage: its columns unprefixed: {csv}"
        );
        let later = run.stage("job[n=4]")["status"].clone();
        if fail_fast {
            assert_eq!(
                later, "skipped",
                "fail_fast: nothing starts after the failure"
            );
        } else {
            assert_eq!(later, "succeeded", "the other instances finish");
            assert_eq!(run.stage("job[n=3]")["status"], "succeeded");
        }
    }
}

#[test]
fn a_large_sweep_prints_a_count_and_its_failures_not_a_line_per_stage() {
    let s = Scratch::new("matrix-console");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "t"
command = ["sh", "-c", "test {matrix.i} != 7"]
matrix = { i = { lines = "ids.txt" } }
"#,
    );
    let ids: String = (0..120).map(|i| format!("{i}\n")).collect();
    s.write("ids.txt", &ids);
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    // The failure is named; the count says how the sweep went; no instance's start or
    // success has a line of its own.
    assert!(run.stderr.contains("t[i=7]: failed"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("120 of 120 stages finished (119 succeeded, 1 did not)"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(": started"), "{}", run.stderr);
    assert!(!run.stderr.contains("t[i=8]: succeeded"), "{}", run.stderr);
    // `validate` names the ends of the order and counts the rest.
    let out = std::process::Command::new(e2e_tests::orchestrate())
        .arg("validate")
        .arg(&plan)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("120 stages"), "{said}");
    assert!(said.contains("t[i=0] → "), "{said}");
    assert!(said.contains("… 110 more …"), "{said}");
    assert!(!said.contains("t[i=50]"), "{said}");
}

#[test]
fn results_csv_has_one_row_per_sample_joining_its_fine_tune_and_eval() {
    let s = Scratch::new("matrix-samples");
    for name in ["a", "b"] {
        let pairs: String = (0..6)
            .map(|i| format!("{{\"prompt\": \"q{name}{i}\", \"completion\": \"{name}\"}}\n"))
            .collect();
        s.write(&format!("{name}.jsonl"), &pairs);
    }
    let tiny = "model = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }";
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "finetune"
kind = "train"
matrix = {{ sample = {{ glob = "*.jsonl" }} }}
[stage.params]
data = "{{matrix.sample}}"
steps = 2
batch_size = 2
seq_len = 16
{tiny}

[[stage]]
name = "eval"
kind = "eval"
after = ["finetune"]
init = "finetune"
matrix = {{ sample = {{ glob = "*.jsonl" }} }}
[stage.params]
data = "{{matrix.sample}}"
seq_len = 16
"#
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // The console shows each instance's metrics once: in the results table, not again in the
    // stage table after it.
    for metric in ["final_loss=", "accuracy="] {
        assert_eq!(
            run.stderr.matches(metric).count(),
            2,
            "{metric} once per instance:\n{}",
            run.stderr
        );
    }
    let csv = std::fs::read_to_string(run.run_dir.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "one row per sample: {csv}");
    assert_eq!(header[0], "sample");
    for column in [
        "finetune.status",
        "finetune.final_loss",
        "eval.status",
        "eval.accuracy",
    ] {
        assert!(header.contains(&column), "{column}: {csv}");
    }
    assert!(
        !header
            .iter()
            .any(|c| c.split('.').any(|part| part.starts_with("t_"))),
        "no internal timing columns: {csv}"
    );
    let cell = |row: &[&str], column: &str| {
        let at = header.iter().position(|c| *c == column).unwrap();
        row[at].to_string()
    };
    for (row, sample) in rows.iter().zip(["a", "b"]) {
        assert!(
            cell(row, "sample").ends_with(&format!("{sample}.jsonl")),
            "{csv}"
        );
        assert_eq!(cell(row, "finetune.status"), "succeeded");
        assert_eq!(cell(row, "eval.status"), "succeeded");
        // Counts are integers, not `2.0`; the eval's figures are its own instance's.
        assert_eq!(cell(row, "finetune.steps"), "2", "{csv}");
        let samples = run.metric(&format!("eval[sample={sample}.jsonl]"), "samples");
        assert_eq!(cell(row, "eval.samples"), format!("{samples}"), "{csv}");
    }
}

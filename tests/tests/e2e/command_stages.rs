//! Command stages end to end: the environment/argv contract, outputs flowing downstream,
//! named failures, retries, and no process of a stage left alive afterwards.

use e2e_tests::{processes_with_env, run_plan, Scratch};

fn marker(name: &str) -> String {
    format!("e2e-{name}-{}", std::process::id())
}

#[test]
fn contract_paths_reach_the_stage_and_outputs_flow_downstream() {
    let s = Scratch::new("contract");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "make-data"
command = ["sh", "-c", "printf hello > \"$ORCHESTRATE_OUTPUT_DIR/data.txt\"; echo \"$ORCHESTRATE_STAGE $ORCHESTRATE_ATTEMPT\" > {output}/stage.txt"]
outputs = ["data.txt", "stage.txt"]

[[stage]]
name = "use-data"
after = ["make-data"]
command = ["sh", "-c", "cat \"$ORCHESTRATE_INPUT_MAKE_DATA/data.txt\" {input.make-data}/stage.txt > {output}/copy.txt; test -S \"$ORCHESTRATE_EVENTS\" && test -f \"$ORCHESTRATE_SPEC\" && pwd > {output}/cwd.txt"]
outputs = ["copy.txt", "cwd.txt"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    let copy =
        std::fs::read_to_string(run.run_dir.join("stages/use-data/output/copy.txt")).unwrap();
    assert_eq!(copy, "hellomake-data 1\n");
    let cwd = std::fs::read_to_string(run.run_dir.join("stages/use-data/output/cwd.txt")).unwrap();
    assert_eq!(
        std::fs::canonicalize(cwd.trim()).unwrap(),
        std::fs::canonicalize(s.path()).unwrap(),
        "stages run in the plan's directory"
    );
    let data = run.stage("make-data");
    assert_eq!(data["status"], "succeeded");
    let record = data["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("data.txt"))
        .expect("data.txt recorded");
    // orchestrate hashed the declared output itself, with BLAKE3: blake3("hello").
    assert_eq!(
        record["blake3"],
        "ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f"
    );
    assert_eq!(record["bytes"], 5);
    // The journal records every state change and parses line by line.
    let journal = std::fs::read_to_string(run.run_dir.join("journal.jsonl")).unwrap();
    let recs: Vec<serde_json::Value> = journal
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.first().unwrap()["rec"], "run_started");
    assert_eq!(recs.last().unwrap()["rec"], "run_finished");
    assert_eq!(
        recs.iter().filter(|r| r["rec"] == "stage_finished").count(),
        2
    );
    assert!(run.run_dir.join("plan.toml").is_file());
    assert!(run.run_dir.join("plan.resolved.json").is_file());
}

#[test]
fn every_failure_has_a_name_and_dependents_are_skipped() {
    let s = Scratch::new("failures");
    let m = marker("failures");
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
grace = "1s"

[[stage]]
name = "exit3"
command = ["sh", "-c", "echo 'something broke' >&2; exit 3"]
env = {{ MARKER = "{m}" }}

[[stage]]
name = "segfault"
command = ["sh", "-c", "kill -SEGV $$"]

[[stage]]
name = "oom-killed"
command = ["sh", "-c", "kill -KILL $$"]

[[stage]]
name = "aborts"
command = ["sh", "-c", "kill -ABRT $$"]

[[stage]]
name = "hang"
command = ["sleep", "300"]
timeout = "1s"
env = {{ MARKER = "{m}" }}

[[stage]]
name = "ignores-term"
command = ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]
timeout = "500ms"
env = {{ MARKER = "{m}" }}

[[stage]]
name = "no-outputs"
command = ["true"]
outputs = ["model.pt"]

[[stage]]
name = "missing-program"
command = ["/nonexistent/train.py"]

[[stage]]
name = "cuda-oom"
command = ["sh", "-c", "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1"]

[[stage]]
name = "downstream"
after = ["exit3"]
command = ["true"]
"#
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(
        run.code,
        Some(1),
        "a failed stage makes exit code 1\n{}",
        run.stderr
    );
    let expect = [
        ("exit3", "exit_code"),
        ("segfault", "signal"),
        ("oom-killed", "killed_externally"),
        ("aborts", "signal"),
        ("hang", "timeout"),
        ("ignores-term", "timeout"),
        ("no-outputs", "missing_outputs"),
        ("missing-program", "spawn_failed"),
        ("cuda-oom", "cuda_oom"),
        ("downstream", "upstream_failed"),
    ];
    for (stage, class) in expect {
        let rec = run.stage(stage);
        assert_eq!(rec["failure"], class, "{stage}: {rec}");
        assert_ne!(rec["status"], "succeeded", "{stage}");
    }
    assert_eq!(run.stage("exit3")["exit_code"], 3);
    assert!(run.stage("exit3")["stderr_tail"]
        .as_str()
        .unwrap()
        .contains("something broke"));
    assert_eq!(run.stage("segfault")["signal"], "SIGSEGV");
    assert_eq!(run.stage("aborts")["signal"], "SIGABRT");
    assert!(run.stage("oom-killed")["error"]
        .as_str()
        .unwrap()
        .contains("out-of-memory killer"));
    assert_eq!(run.stage("downstream")["status"], "skipped");
    assert_eq!(run.stage("downstream")["attempts"], 0);
    assert!(
        processes_with_env(&format!("MARKER={m}")).is_empty(),
        "no process of any stage is left"
    );
}

#[test]
fn retries_until_success_and_counts_attempts() {
    let s = Scratch::new("retries");
    let counter = s.path().join("count");
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[[stage]]
name = "flaky"
retries = 3
command = ["sh", "-c", "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; test $n -ge 3"]

[[stage]]
name = "resumes"
retries = 1
command = ["sh", "-c", "if [ -n \"$ORCHESTRATE_RESUME_DIR\" ]; then test -f \"$ORCHESTRATE_RESUME_DIR/ckpt\" && echo resumed > {{output}}/how; else echo 1 > {{output}}/ckpt; exit 1; fi"]
outputs = ["how"]

[[stage]]
name = "never-retried"
retries = 3
command = ["true"]
outputs = ["absent"]
"#,
            c = counter.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1));
    assert_eq!(run.stage("flaky")["status"], "succeeded");
    assert_eq!(run.stage("flaky")["attempts"], 3);
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "3");
    assert_eq!(
        run.stage("never-retried")["attempts"],
        1,
        "missing outputs are not retried"
    );
    let log = std::fs::read_to_string(run.run_dir.join("stages/flaky/stderr.log")).unwrap();
    // The first attempt's output starts the log; each retry is marked where it begins.
    assert_eq!(log.matches("==== orchestrate: flaky attempt").count(), 2);
    assert!(
        log.contains("==== orchestrate: flaky attempt 2 ===="),
        "{log}"
    );
    assert!(
        log.contains("==== orchestrate: flaky attempt 3 ===="),
        "{log}"
    );
}

#[test]
fn escaped_descendants_are_found_and_killed() {
    let s = Scratch::new("escape");
    let m = marker("escape");
    // A stage exits only once its escaped `sleep` has exec'd (a fixed pause was not always
    // enough on a loaded machine: the report then named `setsid`, caught before its exec).
    // Only the escaped process has ESCAPED in its environment.
    let until_escaped = s.write(
        "until-escaped.sh",
        r#"i=0
while [ $i -lt 200 ]; do
  for f in $(grep -lzxF "$1" /proc/[0-9]*/environ 2>/dev/null); do
    [ "$(cat "${f%/environ}/comm" 2>/dev/null)" = sleep ] && exit 0
  done
  sleep 0.05; i=$((i + 1))
done
echo "no sleep with $1 in its environment after 10 s" >&2
exit 1
"#,
    );
    let wait = until_escaped.display();
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
grace = "1s"

[[stage]]
name = "setsid-daemon"
command = ["sh", "-c", "setsid env ESCAPED=setsid-$MARKER sh -c 'trap \"\" TERM; sleep 300' > /dev/null 2>&1 < /dev/null & sh {wait} ESCAPED=setsid-$MARKER"]
env = {{ MARKER = "{m}" }}

[[stage]]
name = "double-fork"
command = ["sh", "-c", "(ESCAPED=double-$MARKER sleep 300 &) ; sh {wait} ESCAPED=double-$MARKER"]
env = {{ MARKER = "{m}" }}

[[stage]]
name = "forks-100"
command = ["sh", "-c", "for i in $(seq 100); do sleep 300 & done; sleep 0.5; exit 0"]
env = {{ MARKER = "{m}" }}
"#
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for stage in ["setsid-daemon", "double-fork"] {
        let rec = run.stage(stage);
        assert_eq!(rec["status"], "succeeded");
        let left = rec["leftover_processes"].as_array().unwrap();
        assert!(
            !left.is_empty(),
            "{stage}: the leftover is named in the report: {rec}"
        );
        assert!(
            left.iter().any(|p| p.as_str().unwrap().contains("sleep")),
            "{rec}"
        );
    }
    assert_eq!(
        run.stage("forks-100")["leftover_processes"]
            .as_array()
            .unwrap()
            .len(),
        100
    );
    assert!(
        processes_with_env(&format!("MARKER={m}")).is_empty(),
        "every descendant is gone"
    );
}

#[test]
fn events_from_any_process_reach_the_report_and_garbage_is_survived() {
    let s = Scratch::new("events");
    s.write(
        "reporter.py",
        r#"
import json, os, socket, subprocess, sys

def send(obj_bytes):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ["ORCHESTRATE_EVENTS"])
        sock.sendall(obj_bytes)

if len(sys.argv) > 1:  # the grandchild: reports metrics
    send((json.dumps({"v": 1, "event": "metrics", "metrics": {"accuracy": 0.75, "loss": 1.25}}) + "\n").encode())
    sys.exit(0)
garbage = b"x" * (10 * 1024 * 1024) + b"\n" + b"\xff\xfe\xfd\n" + b'{"v":1,"event":"teleport"}\n' + b'{"v":7,"event":"done"}\n'
send(garbage + (json.dumps({"v": 1, "event": "progress", "step": 5, "loss": 2.0}) + "\n").encode())
subprocess.run([sys.executable, __file__, "child"], check=True)
open(os.path.join(os.environ["ORCHESTRATE_OUTPUT_DIR"], "done.txt"), "w").write("ok")
"#,
    );
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "py"
command = ["python3", "reporter.py"]
outputs = ["done.txt"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.metric("py", "accuracy"), 0.75);
    let violations = run.stage("py")["protocol_violations"].clone();
    let text = violations.to_string();
    assert!(text.contains("longer than"), "{text}");
    assert!(text.contains("not UTF-8"), "{text}");
    assert!(text.contains("invalid message"), "{text}");
    assert!(text.contains("version 7"), "{text}");
    let events = std::fs::read_to_string(run.run_dir.join("stages/py/events.jsonl")).unwrap();
    assert!(
        events.contains("\"progress\"") && events.contains("\"metrics\""),
        "{events}"
    );
}

#[test]
fn reporting_failure_then_exiting_zero_is_a_protocol_violation() {
    let s = Scratch::new("liar");
    s.write(
        "liar.py",
        "import json, os, socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
         s.sendall(b'{\"v\":1,\"event\":\"failed\",\"error\":\"diverged\"}\\n')\n",
    );
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "liar"
command = ["python3", "liar.py"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(run.stage("liar")["failure"], "protocol_violation");
    assert!(run.stage("liar")["error"]
        .as_str()
        .unwrap()
        .contains("diverged"));
}

#[test]
fn independent_stages_run_at_the_same_time() {
    let s = Scratch::new("parallel");
    let plan = s.write(
        "plan.toml",
        r#"
[run]
max_parallel = 4
[[stage]]
name = "a"
command = ["sh", "-c", "date +%s.%N > {output}/start; sleep 1; date +%s.%N > {output}/end"]
[[stage]]
name = "b"
command = ["sh", "-c", "date +%s.%N > {output}/start; sleep 1; date +%s.%N > {output}/end"]
[[stage]]
name = "c"
after = ["a", "b"]
command = ["sh", "-c", "date +%s.%N > {output}/start"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let read = |stage: &str, f: &str| -> f64 {
        std::fs::read_to_string(run.run_dir.join(format!("stages/{stage}/output/{f}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        read("a", "start") < read("b", "end") && read("b", "start") < read("a", "end"),
        "a and b overlap"
    );
    assert!(
        read("c", "start") >= read("a", "end").max(read("b", "end")),
        "c waits for both"
    );
}

/// Runs one stage `name` of `command` (a TOML array) in `s` and returns its report's `host`
/// usage, asserting the run succeeded.
fn host_usage(s: &Scratch, name: &str, command: &str) -> serde_json::Value {
    let plan = s.write(
        "plan.toml",
        &format!("[[stage]]\nname = \"{name}\"\ncommand = {command}\n"),
    );
    let run = run_plan(s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    run.stage(name)["host"].clone()
}

#[test]
fn memory_of_a_leftover_process_is_sampled_while_the_stage_runs() {
    // `sh` starts the hog in the background and exits before it: the hog is stopped as a
    // leftover, so its memory is in no rusage the orchestrator gets (nobody but the
    // orchestrator waits for it), only in the samples of the stage's tree taken while it ran.
    let s = Scratch::new("tree-sampling");
    s.write(
        "hog.py",
        "import time\n\
         b = bytearray(300 * 1024 * 1024)\n\
         for i in range(0, len(b), 4096): b[i] = 1\n\
         open('filled', 'w').close()\n\
         time.sleep(3)\n",
    );
    // `sh` exits half a second after the hog has touched every page (not after a fixed
    // second: under load the hog may not have filled its memory by then).
    let host = host_usage(
        &s,
        "bg",
        r#"["sh", "-c", "python3 hog.py & while [ ! -f filled ]; do sleep 0.05; done; sleep 0.5"]"#,
    );
    let rss = host["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        rss > 250 * 1024 * 1024,
        "the hog's 300 MiB were sampled: {host}"
    );
}

#[test]
fn host_memory_and_cpu_time_of_the_tree_are_reported() {
    let s = Scratch::new("host-usage");
    s.write(
        "hog.py",
        "import subprocess, sys, time\n\
         if len(sys.argv) > 1:\n\
         \x20   b = bytearray(300 * 1024 * 1024)\n\
         \x20   for i in range(0, len(b), 4096): b[i] = 1\n\
         \x20   time.sleep(0.6)\n\
         \x20   sys.exit(0)\n\
         t = time.process_time()\n\
         while time.process_time() - t < 0.5: pass\n\
         subprocess.run([sys.executable, __file__, 'child'], check=True)\n",
    );
    let host = host_usage(&s, "hog", r#"["python3", "hog.py"]"#);
    let rss = host["peak_rss_bytes"].as_u64().unwrap();
    assert!(rss > 250 * 1024 * 1024, "the child's 300 MiB show: {host}");
    let cpu = host["cpu_user_s"].as_f64().unwrap() + host["cpu_system_s"].as_f64().unwrap();
    assert!(cpu >= 0.4, "the 0.5 s busy loop shows: {host}");
}

#[test]
fn stdin_is_closed_and_a_channel_closed_at_once_is_harmless() {
    let s = Scratch::new("stdin");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "reads-stdin"
command = ["sh", "-c", "if read -r line; then exit 1; fi; test ! -t 0 && touch {output}/eof"]
outputs = ["eof"]
timeout = "10s"

[[stage]]
name = "hangs-up"
command = ["python3", "-c", "import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['ORCHESTRATE_EVENTS']); s.close()"]
"#,
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stage("reads-stdin")["status"],
        "succeeded",
        "stdin reads end of file at once"
    );
    assert_eq!(run.stage("hangs-up")["status"], "succeeded");
    assert!(run.stage("hangs-up")["protocol_violations"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn gpu_check_required_without_nvml_stops_before_the_first_stage() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    let s = Scratch::new("required");
    let marker = s.path().join("ran");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\ngpu_check = \"required\"\n[[stage]]\nname = \"a\"\ncommand = [\"touch\", \"{}\"]\n",
            marker.display()
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(
        run.stderr.contains("gpu_check = \"required\""),
        "{}",
        run.stderr
    );
    assert!(!marker.exists(), "no stage ran");
}

#[test]
fn follow_echoes_stage_output_and_still_logs_it() {
    let s = Scratch::new("follow");
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"talker\"\ncommand = [\"sh\", \"-c\", \"echo hello from stage; echo oops >&2; printf 'no newline'\"]\n",
    );
    let run = run_plan(&s, &plan, &["--follow"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("[talker] hello from stage\n"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("[talker stderr] oops\n"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("[talker] no newline\n"),
        "{}",
        run.stderr
    );
    let out = std::fs::read_to_string(run.run_dir.join("stages/talker/stdout.log")).unwrap();
    assert!(out.ends_with("hello from stage\nno newline"), "{out:?}");
    let err = std::fs::read_to_string(run.run_dir.join("stages/talker/stderr.log")).unwrap();
    assert!(err.ends_with("oops\n"), "{err:?}");
}

#[test]
fn json_logs_carry_the_run_and_the_stage_attempt_as_spans() {
    let s = Scratch::new("json-spans");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "flaky"
retries = 1
command = ["sh", "-c", "test -f {output}/../tried && exit 0; touch {output}/../tried; exit 1"]
"#,
    );
    let run = run_plan(&s, &plan, &["--log-format", "json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<serde_json::Value> = run
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!lines.is_empty(), "{}", run.stderr);
    // Every event of the run is inside its `run` span, named by the run directory (the
    // summary after it is the CLI's).
    let run_id = run
        .run_dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    for line in lines
        .iter()
        .filter(|l| l["fields"]["message"] != "run finished")
    {
        assert_eq!(line["spans"][0]["run"], run_id.as_str(), "{line}");
    }
    // Each start is inside the span of its stage and attempt.
    let starts: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "stage started")
        .collect();
    assert_eq!(starts.len(), 2, "{}", run.stderr);
    for (n, start) in starts.iter().enumerate() {
        assert_eq!(start["span"]["name"], "stage");
        assert_eq!(start["span"]["stage"], "flaky");
        assert_eq!(start["span"]["attempt"], n as u64 + 1);
    }
}

/// Writes `out` and a version 2 manifest for it in the stage's output directory, with the
/// file's SHA-256 (`good`) or a wrong one; reports nothing on the event channel.
const MANIFEST: &str = "import hashlib, json, os, sys\nd = os.environ['ORCHESTRATE_OUTPUT_DIR']\ndata = b'weights' * 1000\nopen(os.path.join(d, 'out'), 'wb').write(data)\nsha = hashlib.sha256(data).hexdigest() if sys.argv[1] == 'good' else '0' * 64\njson.dump({'v': 2, 'files': [{'path': 'out', 'bytes': len(data), 'sha256': sha}]}, open(os.path.join(d, 'manifest.json'), 'w'))\n";

#[test]
fn a_manifest_a_command_stage_writes_unannounced_is_verified() {
    let s = Scratch::new("own-manifest");
    s.write("manifest.py", MANIFEST);
    // Many short stages before them: their output directories are made (and looked into for
    // a manifest) ahead of time, which must not hide a manifest written later.
    let mut plan = String::from("[run]\nmax_parallel = 1\n");
    for k in 0..20 {
        plan.push_str(&format!(
            "[[stage]]\nname = \"n{k}\"\ncommand = [\"true\"]\n"
        ));
    }
    plan.push_str(
        "[[stage]]\nname = \"good\"\ncommand = [\"python3\", \"manifest.py\", \"good\"]\n",
    );
    plan.push_str("[[stage]]\nname = \"bad\"\ncommand = [\"python3\", \"manifest.py\", \"bad\"]\n");
    let plan = s.write("plan.toml", &plan);
    let run = run_plan(&s, &plan, &["-q"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let good = run.stage("good");
    assert_eq!(good["status"], "succeeded", "{good}");
    let checkpoints = good["checkpoints"].as_array().unwrap();
    assert_eq!(checkpoints.len(), 1, "{good}");
    assert!(checkpoints[0]["path"].as_str().unwrap().ends_with("/out"));
    assert!(checkpoints[0]["sha256"].is_string(), "{good}");
    let bad = run.stage("bad");
    assert_eq!(bad["status"], "failed", "{bad}");
    assert!(
        bad["error"]
            .as_str()
            .unwrap_or_default()
            .contains("checksum"),
        "{bad}"
    );
}

#[test]
fn protocol_violations_past_the_listed_ones_are_counted() {
    let s = Scratch::new("many-violations");
    s.write(
        "garbage.py",
        r#"
import os, socket
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.connect(os.environ["ORCHESTRATE_EVENTS"])
    sock.sendall(b'{"v":1,"event":"teleport"}\n' * 50)
"#,
    );
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"noisy\"\ncommand = [\"python3\", \"garbage.py\"]\n",
    );
    let run = run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let violations = run.stage("noisy")["protocol_violations"].clone();
    let listed = violations.as_array().unwrap();
    assert_eq!(listed.len(), 21, "{violations}");
    assert_eq!(
        listed[20], "and 30 more violation(s) of the event protocol, not listed",
        "{violations}"
    );
}

/// Runs a one-stage plan whose command is `script` (run by `sh`), retried once, with
/// `outputs`; returns the run and the stage's report record.
fn retried(
    name: &str,
    script: &str,
    outputs: &str,
) -> (Scratch, e2e_tests::RunResult, serde_json::Value) {
    let s = Scratch::new(name);
    s.write("stage.sh", script);
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"s\"\ncommand = [\"sh\", \"stage.sh\"]\nretries = 1\noutputs = {outputs}\n"
        ),
    );
    let run = run_plan(&s, &plan, &[]);
    let stage = run.stage("s");
    (s, run, stage)
}

#[test]
fn a_retry_succeeds_only_on_outputs_it_wrote_itself() {
    // Before: a second attempt that exited 0 without writing succeeded on the partial file the
    // failed first attempt had left.
    let first_fails = "out=\"$ORCHESTRATE_OUTPUT_DIR\"\nif [ \"$ORCHESTRATE_ATTEMPT\" = 1 ]; then printf half > \"$out/model.bin\"; exit 1; fi\n";
    let (_s, run, stage) = retried(
        "retry-left-over",
        &format!("{first_fails}test -n \"$ORCHESTRATE_RESUME_DIR\" || exit 9\nexit 0\n"),
        "[\"model.bin\"]",
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(stage["attempts"], 2, "{stage}");
    assert_eq!(stage["failure"], "missing_outputs", "{stage}");
    let error = stage["error"].as_str().unwrap();
    assert!(
        error.contains("model.bin (left by an earlier attempt; this attempt did not write it: write it again, or, if the stage checked that it is complete, touch it)"),
        "{error}"
    );

    // Written again, or touched after checking it: the retry succeeds.
    for (name, then) in [
        ("retry-rewrites", "printf whole > \"$out/model.bin\"\n"),
        ("retry-touches", "touch \"$out/model.bin\"\n"),
    ] {
        let (_s, run, stage) = retried(name, &format!("{first_fails}{then}"), "[\"model.bin\"]");
        assert_eq!(run.code, Some(0), "{name}: {}", run.stderr);
        assert_eq!(stage["attempts"], 2, "{name}: {stage}");
    }

    // A declared directory that a retry resumes in: what the failed attempt left there (its
    // checkpoint) stays and counts along with what the retry wrote; a retry that wrote nothing
    // in it does not succeed.
    let resumes = "out=\"$ORCHESTRATE_OUTPUT_DIR\"; mkdir -p \"$out/ckpt\"\nif [ \"$ORCHESTRATE_ATTEMPT\" = 1 ]; then echo 1 > \"$out/ckpt/step-1\"; exit 1; fi\ntest -f \"$ORCHESTRATE_RESUME_DIR/ckpt/step-1\" || exit 9\n";
    let (_s, run, stage) = retried(
        "retry-resumes",
        &format!("{resumes}echo 2 > \"$out/ckpt/step-2\"\n"),
        "[\"ckpt\"]",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let recorded: Vec<&str> = stage["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("outputs recorded: {stage}"))
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert!(
        recorded.iter().any(|p| p.ends_with("ckpt/step-1"))
            && recorded.iter().any(|p| p.ends_with("ckpt/step-2")),
        "{recorded:?}"
    );
    let (_s, run, stage) = retried("retry-resumes-idle", resumes, "[\"ckpt\"]");
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(stage["failure"], "missing_outputs", "{stage}");
}

/// A stage that sends `n` progress events claiming its last step (`step == total`) as fast as
/// it can, then exits.
fn repeated_final_step_plan(s: &e2e_tests::Scratch, n: usize) -> String {
    let script = s.write(
        "final.py",
        &format!(
            "import json, os, socket\nc = socket.socket(socket.AF_UNIX)\nc.connect(os.environ['ORCHESTRATE_EVENTS'])\n\
             line = (json.dumps({{'v': 1, 'event': 'progress', 'step': 5, 'total_steps': 5, 'loss': 1.0}}) + '\\n').encode()\n\
             c.sendall(line * {n})\nc.close()\n"
        ),
    );
    format!(
        "[[stage]]\nname = \"final\"\ncommand = [\"python3\", \"{}\"]\n",
        script.display()
    )
}

#[test]
fn a_stage_repeating_its_final_step_gets_a_bounded_number_of_console_lines_and_run_events() {
    // Before: each of the 20,000 became a console line and a run event (`step >= total` was
    // exempt from the 2 s throttle every time, not once).
    const N: usize = 20_000;
    let s = e2e_tests::Scratch::new("final-step-flood");
    let plan = s.write("plan.toml", &repeated_final_step_plan(&s, N));
    let run = e2e_tests::run_plan(&s, &plan, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = run
        .stderr
        .lines()
        .filter(|l| l.contains("final: step 5/5"))
        .count();
    // The first final step at once, then at most one per 2 s while the flood lasts.
    assert!((1..=10).contains(&lines), "{lines} progress lines");

    let d = e2e_tests::daemon::TestDaemon::start_in(s.path(), "daemon.log");
    let mut c = d.connect();
    let id = c.submit_toml(&repeated_final_step_plan(&s, N), s.path());
    let finished = c.wait(&id);
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let events = std::fs::read_to_string(d.runs.join(&id).join("events.jsonl")).unwrap();
    let progress = events
        .lines()
        .filter(|l| l.contains("\"progress\""))
        .count();
    assert!(
        (1..=10).contains(&progress),
        "{progress} progress run events"
    );
}

/// A descriptor `orchestrate` inherited from whoever started it (a CI runner's pipe, a
/// shell's own file) is not passed on to its stages: each stage's process holds stdin,
/// stdout and stderr only, as `subprocess` children do.
#[test]
fn a_descriptor_orchestrate_inherited_does_not_reach_its_stages() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let s = Scratch::new("inherited-fd");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "shell"
command = ["sh", "-c", "if [ -e /proc/$$/fd/7 ]; then echo held; else echo free; fi"]

[[stage]]
name = "python"
command = ["python3", "-c", "import os; print('held' if os.path.exists('/proc/self/fd/7') else 'free')"]
"#,
    );
    let (read, write) = nix::unistd::pipe().unwrap();
    let write_fd = write.as_raw_fd();
    let run_dir = s.path().join("run");
    let mut cmd = std::process::Command::new(e2e_tests::orchestrate());
    cmd.arg("--plan").arg(&plan).arg("--run-dir").arg(&run_dir);
    // SAFETY: between fork and exec only dup2, which is async-signal-safe; the copy at 7 has
    // no close-on-exec flag, as a descriptor a shell hands down.
    unsafe {
        cmd.pre_exec(move || match libc::dup2(write_fd, 7) {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
    let out = cmd.output().expect("orchestrate runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for stage in ["shell", "python"] {
        let seen =
            std::fs::read_to_string(run_dir.join(format!("stages/{stage}/stdout.log"))).unwrap();
        assert_eq!(seen.trim(), "free", "{stage} held descriptor 7");
    }
    drop(write);
    drop(read);
}

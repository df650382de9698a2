//! A run spread over every node of a multi-node allocation (`scripts/slurm-cluster start
//! --nodes 3`, which `.ci/run` does: three `slurmd` on this host): a 300-instance sweep reaches
//! all three nodes, each instance's node and GPU check in the report and `results.csv`, with
//! the Slurm queries of the whole run counted; a `nodes = 2` srun stage spans two nodes with
//! the right ranks; an instance whose job step Slurm kills is retried and the sweep succeeds
//! without rerunning what finished; a requeue mid-sweep resumes without rerunning finished
//! instances; a node lost under an instance, or under a `nodes = 2` stage, costs only the
//! attempts running there, retried off that node.

use super::{context, field, job_log, node_lock, slurm_up, wait_for_end, wait_until};
use e2e_tests::{
    journal_records as journal, orchestrate, read_report as report, repo_root, Scratch,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The nodes of the test cluster, or `None` (said loudly) when it has fewer than three.
fn three_nodes(test: &str) -> Option<Vec<String>> {
    if !slurm_up(test) {
        return None;
    }
    let out = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%N"])
        .output()
        .expect("sinfo runs");
    let nodes: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if nodes.len() >= 3 {
        return Some(nodes.into_iter().collect());
    }
    let message = format!(
        "{test}: the Slurm cluster has {} node(s), not 3: start it with `scripts/slurm-cluster start --nodes 3`",
        nodes.len()
    );
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false") {
        panic!("{message}");
    }
    eprintln!("\n!!!! NOT RUN: {message} !!!!\n");
    None
}

/// A directory of `squeue`, `sacct` and `scontrol` that log each call to `calls` and run the
/// real command: put first in the job's PATH, it counts the run's queries of Slurm.
fn counting_wrappers(dir: &Path) -> (PathBuf, PathBuf) {
    let bin = dir.join("count-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = dir.join("slurm-calls");
    for cmd in ["squeue", "sacct", "scontrol"] {
        let real = Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .unwrap();
        let real = String::from_utf8_lossy(&real.stdout).trim().to_string();
        assert!(!real.is_empty(), "{cmd} is not installed");
        let script = bin.join(cmd);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$(date +%s) {cmd} $*\" >> {}\nexec {real} \"$@\"\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (bin, calls)
}

/// A directory with an `srun` that logs its arguments to `calls` (one line a call) and execs
/// the real one: put first in the job's PATH, it shows how each step was asked for.
fn logging_srun(dir: &Path) -> (PathBuf, PathBuf) {
    let bin = dir.join("srun-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = dir.join("srun-calls");
    let real = Command::new("sh")
        .args(["-c", "command -v srun"])
        .output()
        .unwrap();
    let real = String::from_utf8_lossy(&real.stdout).trim().to_string();
    assert!(!real.is_empty(), "srun is not installed");
    let script = bin.join("srun");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\nexec {real} \"$@\"\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (bin, calls)
}

/// The srun calls of instance `name` in `calls` (from [`logging_srun`]), in order.
fn srun_calls_of(calls: &Path, name: &str) -> Vec<String> {
    let tag = format!("--job-name={name} ");
    std::fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&tag))
        .map(String::from)
        .collect()
}

/// Submits the batch script over three nodes (four CPUs each) with `env` (`NAME=VALUE`, no
/// commas) added to the job's environment; returns the job id.
fn sbatch_three(dir: &Path, env: &[String], plan: &Path) -> String {
    let mut export = String::from("--export=ALL");
    for e in env {
        export.push(',');
        export.push_str(e);
    }
    submit_three(dir, &[&export], None, plan)
}

/// Submits the batch script over three nodes (four CPUs each) with `args` added to sbatch's
/// and `path` as the job's PATH, if given; returns the job id.
fn submit_three(dir: &Path, args: &[&str], path: Option<&str>, plan: &Path) -> String {
    let mut cmd = Command::new("sbatch");
    cmd.arg("--parsable")
        .arg(format!("--chdir={}", dir.display()))
        .args(["--nodes=3", "--ntasks-per-node=4"])
        .args(args)
        .arg(repo_root().join("configs/slurm/pipeline.sbatch"))
        .arg(plan)
        .env("ORCHESTRATE", orchestrate())
        .stdin(Stdio::null());
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    let out = cmd.output().expect("sbatch runs");
    assert!(
        out.status.success(),
        "sbatch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// Each instance's report record, by name.
fn instances(report: &Value) -> BTreeMap<String, Value> {
    report["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_string(), s.clone()))
        .collect()
}

/// How many times each instance wrote its line to `ran` (`NAME NODE` lines).
fn runs_by_instance(ran: &Path) -> BTreeMap<String, Vec<String>> {
    let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(ran).unwrap_or_default().lines() {
        if let Some((name, node)) = line.split_once(' ') {
            runs.entry(name.to_string())
                .or_default()
                .push(node.to_string());
        }
    }
    runs
}

fn sweep_plan(dir: &Path, name: &str, count: usize, command: &str, extra: &str) -> PathBuf {
    let values = dir.join("values");
    let lines: Vec<String> = (1..=count).map(|i| i.to_string()).collect();
    std::fs::write(&values, lines.join("\n") + "\n").unwrap();
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        format!(
            "[run]\nname = \"{name}\"\ngrace = \"5s\"\n[[stage]]\nname = \"work\"\n{extra}matrix = {{ i = {{ lines = \"{}\" }} }}\ncommand = [\"sh\", \"-c\", {}]\n",
            values.display(),
            serde_json::to_string(command).unwrap()
        ),
    )
    .unwrap();
    plan
}

#[test]
fn a_300_instance_sweep_reaches_all_three_nodes_within_the_query_bound() {
    let Some(nodes) =
        three_nodes("a_300_instance_sweep_reaches_all_three_nodes_within_the_query_bound")
    else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-spread");
    let ran = s.path().join("ran");
    // Each instance reports a metric (relayed from its node over the step's stdout) and leaves
    // a process behind in its session (which the wrapper must kill and reap).
    let send = s.path().join("send.py");
    std::fs::write(
        &send,
        "import json, os, socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['ORCHESTRATE_EVENTS'])\ns.sendall((json.dumps({'v': 1, 'event': 'metrics', 'metrics': {'double': 2 * int(sys.argv[1])}}) + '\\n').encode())\n",
    )
    .unwrap();
    let plan = sweep_plan(
        s.path(),
        "spread",
        300,
        &format!(
            "echo \"work[i={{matrix.i}}] $SLURMD_NODENAME\" >> {}; python3 {} {{matrix.i}}; echo out-{{matrix.i}}; if [ {{matrix.i}} = 1 ]; then scontrol --version >/dev/null; fi; sleep 600 & echo $! > {{output}}/left",
            ran.display(),
            send.display()
        ),
        "",
    );
    let (bin, calls) = counting_wrappers(s.path());
    let path = format!("PATH={}:{}", bin.display(), std::env::var("PATH").unwrap());
    let t0 = Instant::now();
    let id = sbatch_three(s.path(), &[path], &plan);
    let end = wait_for_end(&id, Duration::from_secs(600), &job_log(s.path(), &id));
    let elapsed = t0.elapsed();
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    let run_dir = s.path().join(format!("runs/spread-slurm-{id}"));
    let r = report(&run_dir);
    assert_eq!(r["status"], "succeeded", "{why}");
    let all = instances(&r);
    assert_eq!(all.len(), 300);
    let mut seen = BTreeSet::new();
    for (name, st) in &all {
        assert_eq!(st["status"], "succeeded", "{name}: {st}");
        assert_eq!(st["attempts"], 1, "{name}: {st}");
        let tasks = st["tasks"].as_array().expect("the step's task");
        assert_eq!(tasks.len(), 1, "{st}");
        let node = tasks[0]["node"].as_str().unwrap();
        assert!(nodes.iter().any(|n| n == node), "{st}");
        seen.insert(node.to_string());
        // Its event came back from its node; its stdout is in its log, without the events.
        let i: u64 = name
            .trim_start_matches("work[i=")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        assert_eq!(
            st["metrics"]["double"].as_f64(),
            Some(2.0 * i as f64),
            "{name}: {st}"
        );
        let log = std::fs::read_to_string(run_dir.join(format!("stages/{name}/stdout.log")))
            .unwrap_or_else(|e| panic!("{name}'s stdout log: {e}"));
        assert!(log.contains(&format!("out-{i}")), "{name}: {log:?}");
        assert!(!log.contains("orchestrate-event"), "{name}: {log:?}");
        let checks = st["nodes"].as_array().expect("the node's GPU check");
        assert_eq!(checks.len(), 1, "{st}");
        assert_eq!(checks[0]["node"], node, "{st}");
        assert!(
            ["unavailable", "clean"].contains(&checks[0]["verdict"].as_str().unwrap()),
            "{st}"
        );
        // What the instance left running was killed and reaped on its node.
        let left: i32 = std::fs::read_to_string(run_dir.join(format!("stages/{name}/output/left")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            !Path::new(&format!("/proc/{left}")).exists(),
            "{name}'s sleep {left} is still there"
        );
    }
    assert_eq!(seen.len(), 3, "instances on every node: {seen:?}");
    // Every instance ran once, on the node the report names.
    let runs = runs_by_instance(&ran);
    assert_eq!(runs.len(), 300);
    for (name, on) in &runs {
        assert_eq!(on.len(), 1, "{name} ran {on:?}");
        assert_eq!(on[0], all[name]["tasks"][0]["node"].as_str().unwrap());
    }
    // results.csv names each instance's node.
    let csv = std::fs::read_to_string(run_dir.join("results.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header
        .iter()
        .position(|c| *c == "node")
        .expect("a node column");
    let csv_nodes: BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(col).unwrap())
        .collect();
    assert_eq!(csv_nodes.len(), 3, "{csv_nodes:?}");
    // At most one squeue/sacct/scontrol query per 30 s of the run, plus one; instance 1's own
    // `scontrol --version` shows that the count sees the job's calls.
    let queries = std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        queries.contains("scontrol --version"),
        "the wrappers were not used: {queries:?}"
    );
    let count = queries
        .lines()
        .filter(|l| !l.ends_with("--version"))
        .count() as u64;
    let bound = 1 + elapsed.as_secs() / 30;
    assert!(
        count <= bound,
        "{count} Slurm queries in {elapsed:?} (bound {bound}):\n{queries}"
    );
    eprintln!("300 instances over 3 nodes in {elapsed:?}; {count} Slurm queries");
}

#[test]
fn a_two_node_srun_stage_spans_two_nodes_with_the_right_ranks() {
    let Some(_) = three_nodes("a_two_node_srun_stage_spans_two_nodes_with_the_right_ranks") else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-two-nodes");
    let plan = s.path().join("plan.toml");
    std::fs::write(
        &plan,
        "[run]\nname = \"two\"\n[[stage]]\nname = \"dist\"\nnodes = 2\ncommand = [\"sh\", \"-c\", \"echo $RANK $WORLD_SIZE $NODE_RANK $SLURMD_NODENAME > {output}/rank-$RANK.txt\"]\n",
    )
    .unwrap();
    let id = sbatch_three(s.path(), &[], &plan);
    let end = wait_for_end(&id, Duration::from_secs(300), &job_log(s.path(), &id));
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    let run_dir = s.path().join(format!("runs/two-slurm-{id}"));
    let r = report(&run_dir);
    let dist = &instances(&r)["dist"];
    assert_eq!(dist["status"], "succeeded", "{why}");
    let tasks = dist["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2, "{dist}");
    let mut task_nodes = BTreeSet::new();
    for (rank, task) in tasks.iter().enumerate() {
        assert_eq!(task["rank"], rank, "{task}");
        assert_eq!(task["exit_code"], 0, "{task}");
        let node = task["node"].as_str().unwrap().to_string();
        let env =
            std::fs::read_to_string(run_dir.join(format!("stages/dist/output/rank-{rank}.txt")))
                .unwrap();
        let words: Vec<&str> = env.split_whitespace().collect();
        assert_eq!(
            words,
            [
                rank.to_string().as_str(),
                "2",
                rank.to_string().as_str(),
                node.as_str()
            ],
            "{env}"
        );
        task_nodes.insert(node);
    }
    assert_eq!(task_nodes.len(), 2, "two nodes: {task_nodes:?}");
    let checks = dist["nodes"].as_array().expect("node checks");
    assert_eq!(checks.len(), 2, "{dist}");
}

#[test]
fn an_instance_whose_step_slurm_kills_is_retried_and_nothing_finished_reruns() {
    let Some(_) =
        three_nodes("an_instance_whose_step_slurm_kills_is_retried_and_nothing_finished_reruns")
    else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-step-killed");
    let ran = s.path().join("ran");
    let started = s.path().join("started-7");
    // Instance 7's first attempt waits to be killed; the others finish at once.
    let plan = sweep_plan(
        s.path(),
        "killed",
        24,
        &format!(
            "echo \"work[i={{matrix.i}}] $SLURMD_NODENAME\" >> {ran}; if [ {{matrix.i}} = 7 ] && [ ! -e {started} ]; then touch {started}; exec sleep 300; fi",
            ran = ran.display(),
            started = started.display()
        ),
        "retries = 1\n",
    );
    let id = sbatch_three(s.path(), &[], &plan);
    let run_dir = s.path().join(format!("runs/killed-slurm-{id}"));
    let step_file = run_dir.join("stages/work[i=7]/tasks/step");
    wait_until(Duration::from_secs(120), "instance 7's step", || {
        started.exists() && std::fs::read_to_string(&step_file).is_ok_and(|s| s.contains('.'))
    });
    let step = std::fs::read_to_string(&step_file)
        .unwrap()
        .trim()
        .to_string();
    let killed = Command::new("scancel")
        .args(["--signal=KILL", &step])
        .status()
        .unwrap();
    assert!(killed.success(), "scancel {step}");
    let end = wait_for_end(&id, Duration::from_secs(300), &job_log(s.path(), &id));
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    let r = report(&run_dir);
    assert_eq!(r["status"], "succeeded", "{why}");
    let all = instances(&r);
    let runs = runs_by_instance(&ran);
    for (name, st) in &all {
        assert_eq!(st["status"], "succeeded", "{st}");
        let want = if name == "work[i=7]" { 2 } else { 1 };
        assert_eq!(st["attempts"], want, "{name}: {st}");
        assert_eq!(runs[name].len(), want, "{name} ran on {:?}", runs[name]);
    }
    // The lost attempt names the node and the step it was lost with, in the report and on
    // the console (the job's output).
    let seven = &all["work[i=7]"];
    let first_node = &runs["work[i=7]"][0];
    assert_eq!(
        seven["lost"],
        serde_json::json!([{ "attempt": 1, "node": first_node, "step": step }]),
        "{seven}"
    );
    for (name, st) in all.iter().filter(|(n, _)| *n != "work[i=7]") {
        assert!(st.get("lost").is_none(), "{name} was not lost: {st}");
    }
    let output = std::fs::read_to_string(job_log(s.path(), &id)).unwrap_or_default();
    assert!(
        output
            .lines()
            .any(|l| l.contains("work[i=7]") && l.contains(&format!("lost on node {first_node}"))),
        "the console names the node: {output}"
    );
    let finished = journal(&run_dir)
        .iter()
        .filter(|r| r["rec"] == "stage_finished" && r["stage"] == "work[i=7]")
        .map(|r| r["status"].as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert_ne!(
        finished[0], "succeeded",
        "the killed attempt failed: {finished:?}"
    );
}

#[test]
fn a_requeue_mid_sweep_resumes_without_rerunning_finished_instances() {
    let Some(_) = three_nodes("a_requeue_mid_sweep_resumes_without_rerunning_finished_instances")
    else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-spread-requeue");
    let ran = s.path().join("ran");
    // Instances after the 20th wait on the first start (until the requeue), not on the second.
    let plan = sweep_plan(
        s.path(),
        "requeued",
        40,
        &format!(
            "echo \"work[i={{matrix.i}}] $SLURMD_NODENAME\" >> {}; if [ {{matrix.i}} -gt 20 ] && [ \"${{{{SLURM_RESTART_COUNT:-0}}}}\" = 0 ]; then exec sleep 300; fi",
            ran.display()
        ),
        "",
    );
    let id = sbatch_three(s.path(), &[], &plan);
    let run_dir = s.path().join(format!("runs/requeued-slurm-{id}"));
    wait_until(Duration::from_secs(120), "the first 20 to finish", || {
        journal(&run_dir)
            .iter()
            .filter(|r| r["rec"] == "stage_finished" && r["status"] == "succeeded")
            .count()
            >= 20
    });
    let before: BTreeSet<String> = journal(&run_dir)
        .iter()
        .filter(|r| r["rec"] == "stage_finished" && r["status"] == "succeeded")
        .map(|r| r["stage"].as_str().unwrap().to_string())
        .collect();
    let requeued = Command::new("scontrol")
        .args(["requeue", &id])
        .status()
        .unwrap();
    assert!(requeued.success());
    let end = wait_for_end(&id, Duration::from_secs(300), &job_log(s.path(), &id));
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    assert_eq!(field(&end, "Restarts"), "1", "{why}");
    let r = report(&run_dir);
    assert_eq!(r["status"], "succeeded", "{why}");
    let runs = runs_by_instance(&ran);
    for name in &before {
        assert_eq!(
            runs[name].len(),
            1,
            "{name} finished before the requeue and ran again"
        );
    }
    assert_eq!(instances(&r).len(), 40);
    assert!(
        instances(&r).values().all(|st| st["status"] == "succeeded"),
        "{why}"
    );
}

/// Restarts the `slurmd` of `node` (killed by a test) when dropped, and waits for the node to
/// be back in service, so the tests after it find three nodes.
struct RestartSlurmd(String);

impl Drop for RestartSlurmd {
    fn drop(&mut self) {
        let _ = Command::new("slurmd").args(["-N", &self.0]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let _ = Command::new("scontrol")
                .args(["update", &format!("NodeName={}", self.0), "State=RESUME"])
                .stderr(Stdio::null())
                .status();
            let state = Command::new("sinfo")
                .args(["-h", "-n", &self.0, "-o", "%T"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            if state == "idle" {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("node {} did not come back within 60 s", self.0);
    }
}

/// Submits the batch script over three nodes with `--no-kill` (the job keeps its other nodes
/// when one fails) and an `srun` that logs its calls ([`logging_srun`]) first in its PATH;
/// returns the job id and where the srun calls are logged.
fn sbatch_three_no_kill(dir: &Path, plan: &Path) -> (String, PathBuf) {
    let (srun_bin, srun_calls) = logging_srun(dir);
    let path = format!(
        "{}:{}",
        srun_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let id = submit_three(dir, &["--no-kill"], Some(&path), plan);
    (id, srun_calls)
}

/// Kills the `slurmd` of `node` (SIGKILL); it is started again when the guard is dropped.
fn kill_slurmd(node: &str) -> RestartSlurmd {
    // Where scripts/slurm-cluster keeps its state (SLURM_CLUSTER_DIR there too).
    let state =
        std::env::var("SLURM_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/orchestrate-slurm".into());
    let pidfile = format!("{state}/slurmd-{node}.pid");
    let pid = std::fs::read_to_string(&pidfile).expect("the node's slurmd pid file");
    let restart = RestartSlurmd(node.to_string());
    let killed = Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success());
    restart
}

#[test]
fn a_node_whose_slurmd_dies_loses_only_its_running_instances() {
    let Some(nodes) = three_nodes("a_node_whose_slurmd_dies_loses_only_its_running_instances")
    else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-node-lost");
    let ran = s.path().join("ran");
    let plan = sweep_plan(
        s.path(),
        "lost",
        60,
        &format!(
            "echo \"work[i={{matrix.i}}] $SLURMD_NODENAME\" >> {}; sleep 2",
            ran.display()
        ),
        "retries = 3\n",
    );
    let (id, srun_calls) = sbatch_three_no_kill(s.path(), &plan);
    // The batch script runs on the first node; the last one is lost once it runs instances.
    let victim = nodes.last().unwrap().clone();
    wait_until(
        Duration::from_secs(120),
        "an instance on the last node",
        || {
            runs_by_instance(&ran)
                .values()
                .any(|on| on.contains(&victim))
        },
    );
    let _restart = kill_slurmd(&victim);
    let end = wait_for_end(&id, Duration::from_secs(300), &job_log(s.path(), &id));
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    let run_dir = s.path().join(format!("runs/lost-slurm-{id}"));
    let r = report(&run_dir);
    assert_eq!(r["status"], "succeeded", "{why}");
    let all = instances(&r);
    assert_eq!(all.len(), 60);
    assert!(all.values().all(|st| st["status"] == "succeeded"), "{why}");
    // Some attempts were lost with the node and retried; every instance's command ran to its
    // end once (a lost step's command never started, or was cut off on the lost node).
    let retried: Vec<&String> = all
        .iter()
        .filter(|(_, st)| st["attempts"].as_u64().unwrap() > 1)
        .map(|(n, _)| n)
        .collect();
    assert!(
        !retried.is_empty(),
        "no attempt was lost with {victim}: {why}"
    );
    let runs = runs_by_instance(&ran);
    for (name, st) in &all {
        let last = st["tasks"][0]["node"].as_str().unwrap();
        let attempts = st["attempts"].as_u64().unwrap() as usize;
        assert!(
            runs[name].len() <= attempts,
            "{name} ran {:?} in {attempts} attempts",
            runs[name]
        );
        if attempts > 1 {
            assert_ne!(last, victim, "{name} was retried on the lost node: {st}");
        }
        // Every attempt lost was lost on the dead node, and each one after the first loss
        // asked srun to keep off it.
        let lost = st["lost"].as_array().cloned().unwrap_or_default();
        assert!(
            lost.iter().all(|l| l["node"] == victim.as_str()),
            "{name}: {st}"
        );
        assert_eq!(
            lost.len(),
            attempts - 1,
            "every failed attempt names its node: {st}"
        );
        let calls = srun_calls_of(&srun_calls, name);
        assert_eq!(
            calls.len(),
            attempts,
            "{name}: one srun per attempt: {calls:?}"
        );
        let excluding = format!("--exclude={victim} ");
        let first_loss = lost
            .iter()
            .map(|l| l["attempt"].as_u64().unwrap() as usize)
            .min();
        for (k, call) in calls.iter().enumerate() {
            let after_loss = first_loss.is_some_and(|a| k + 1 > a);
            assert_eq!(
                call.contains(&excluding),
                after_loss,
                "{name} attempt {}: {call}",
                k + 1
            );
        }
    }
    let lost_total: usize = all
        .values()
        .map(|st| st["lost"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(lost_total > 0, "no loss recorded on {victim}: {why}");
    eprintln!(
        "lost {victim}: {} instance(s) retried: {retried:?}; {lost_total} attempt(s) recorded lost",
        retried.len()
    );
}

/// A `nodes = 2` srun stage whose attempt is lost with a node (its `slurmd` killed) is
/// retried on two other nodes, kept off the lost one, and the report names the node.
#[test]
fn a_two_node_srun_stage_lost_with_a_node_is_retried_off_that_node() {
    let Some(_) = three_nodes("a_two_node_srun_stage_lost_with_a_node_is_retried_off_that_node")
    else {
        return;
    };
    let _node = node_lock(true);
    let s = Scratch::new("slurm-two-nodes-lost");
    let ran = s.path().join("ran");
    let plan = s.path().join("plan.toml");
    // The first attempt's tasks wait to be lost; the retry's finish at once. Only a loss is
    // retried (`retry_on`).
    let command = format!(
        "echo \"$ORCHESTRATE_ATTEMPT $RANK $SLURMD_NODENAME\" >> {}; if [ \"$ORCHESTRATE_ATTEMPT\" = 1 ]; then exec sleep 300; fi",
        ran.display()
    );
    std::fs::write(
        &plan,
        format!(
            "[run]\nname = \"mnlost\"\ngrace = \"5s\"\n[[stage]]\nname = \"dist\"\nnodes = 2\nretries = 2\nretry_on = [\"lost\"]\ncommand = [\"sh\", \"-c\", {}]\n",
            serde_json::to_string(&command).unwrap()
        ),
    )
    .unwrap();
    let (id, srun_calls) = sbatch_three_no_kill(s.path(), &plan);
    let first_attempt = || -> Vec<String> {
        std::fs::read_to_string(&ran)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("1 "))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    };
    wait_until(
        Duration::from_secs(120),
        "both tasks of the first attempt",
        || first_attempt().len() == 2,
    );
    // Lose a node of the step that is not the batch script's.
    let batch_host = field(&super::job_fields(&id), "BatchHost");
    let victim = first_attempt()
        .into_iter()
        .find(|n| *n != batch_host)
        .expect("a task off the batch node");
    let _restart = kill_slurmd(&victim);
    let end = wait_for_end(&id, Duration::from_secs(300), &job_log(s.path(), &id));
    let why = context(s.path(), &id);
    assert_eq!(field(&end, "JobState"), "COMPLETED", "{why}");
    let r = report(&s.path().join(format!("runs/mnlost-slurm-{id}")));
    let dist = &instances(&r)["dist"];
    assert_eq!(dist["status"], "succeeded", "{why}");
    assert_eq!(dist["attempts"], 2, "{dist}");
    let lost = dist["lost"].as_array().expect("the loss is recorded");
    assert_eq!(lost.len(), 1, "{dist}");
    assert_eq!(lost[0]["attempt"], 1, "{dist}");
    assert_eq!(lost[0]["node"], victim.as_str(), "{dist}");
    // The retry asked srun to keep off the lost node, and its two tasks ran elsewhere.
    let calls = srun_calls_of(&srun_calls, "dist");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(!calls[0].contains("--exclude"), "{}", calls[0]);
    assert!(
        calls[1].contains(&format!("--exclude={victim} ")),
        "{}",
        calls[1]
    );
    let tasks = dist["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2, "{dist}");
    let nodes: BTreeSet<&str> = tasks.iter().map(|t| t["node"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 2, "two nodes: {dist}");
    assert!(
        !nodes.contains(victim.as_str()),
        "retried on {victim}: {dist}"
    );
    for task in tasks {
        assert_eq!(task["exit_code"], 0, "{task}");
    }
}

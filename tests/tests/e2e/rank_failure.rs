//! Rank failure: when one rank of a multi-process stage exits non-zero, the others are
//! stopped after the stage's `rank_grace` instead of waiting in a collective until its timeout,
//! and the failure names the rank and its exit.

use e2e_tests::{framework_python, orchestrate_with, processes_with_env, run_plan_with, Scratch};

/// Two gloo ranks: both all-reduce once; then rank 1 exits 1 and rank 0 waits in the next
/// all-reduce, which rank 1 never joins. As an NCCL rank's peers do, rank 0 waits on: a child
/// of rank 1 (a data loader's worker, say) keeps rank 1's connections open, so gloo does not
/// see them close.
const RANK_EXITS: &str = r#"
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
if rank == 1:
    if os.fork() == 0:
        time.sleep(3600)
    time.sleep(0.5)
    os._exit(1)
dist.all_reduce(t)
"#;

/// A launcher of its own (not torchrun): starts the ranks and waits for each in turn, as
/// simple launchers do, so nothing stops rank 0.
const LAUNCHER: &str = r#"
import os, subprocess, sys
procs = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=os.environ["MASTER_PORT"])
    procs.append(subprocess.Popen([sys.executable, sys.argv[1]], env=env))
sys.exit(max(p.wait() for p in procs))
"#;

fn stage_seconds(stage: &serde_json::Value) -> f64 {
    stage["timing"]["exited"].as_f64().unwrap() - stage["timing"]["spawned"].as_f64().unwrap()
}

#[test]
fn a_rank_that_exits_1_gets_its_peers_stopped_within_the_grace_and_is_named() {
    let Some(python) = framework_python() else {
        return;
    };
    let s = Scratch::new("rank-failure");
    let script = s.write("rank.py", RANK_EXITS);
    let launcher = s.write("launch.py", LAUNCHER);
    let marker = format!("rank-failure-{}", std::process::id());
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"
[run]
rank_grace = "3s"

[[stage]]
name = "own"
command = ["python3", "{launcher}", "{script}"]
timeout = "10m"
env = {{ MARKER = "{marker}" }}

[[stage]]
name = "torchrun"
command = ["python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "{{master_port}}", "{script}"]
timeout = "10m"
env = {{ MARKER = "{marker}" }}
"#,
            script = script.display(),
            launcher = launcher.display()
        ),
    );
    let run = run_plan_with(orchestrate_with(&python), &s, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    collecting_launcher(&s, &script, &marker, &python);

    // Its own launcher leaves rank 0 in the all-reduce: orchestrate stops it after the grace.
    let own = run.stage("own");
    assert_eq!(own["failure"], "rank_failed", "{own}");
    let error = own["error"].as_str().unwrap();
    assert!(
        error.contains("rank 1 exited with code 1")
            && error.contains("still ran after the rank_grace of 3s and were stopped"),
        "{error}"
    );
    assert!(
        run.stderr
            .contains("own: rank 1 exited with code 1; the other ranks are stopped"),
        "{}",
        run.stderr
    );
    assert!(stage_seconds(&own) < 60.0, "not left until the timeout");

    // torchrun stops its other ranks itself; the failure still names the rank.
    let torchrun = run.stage("torchrun");
    assert_eq!(torchrun["failure"], "rank_failed", "{torchrun}");
    let error = torchrun["error"].as_str().unwrap();
    assert!(error.contains("rank 1 exited with code 1"), "{error}");
    assert!(stage_seconds(&torchrun) < 60.0);

    assert!(
        processes_with_env(&format!("MARKER={marker}")).is_empty(),
        "no process of any stage is left"
    );
}

/// A launcher that collects each rank as it exits (bash's `wait`), so that a rank's exit
/// shows in `/proc` for an instant only: seen through the kernel's process events, which
/// orchestrate may listen to as root (not run otherwise).
fn collecting_launcher(
    s: &Scratch,
    script: &std::path::Path,
    marker: &str,
    python: &std::path::Path,
) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: the rank-failure case under bash's `wait` is not run");
        return;
    }
    let plan = s.write(
        "bash.toml",
        &format!(
            r#"
[run]
rank_grace = "3s"

[[stage]]
name = "bash"
command = ["bash", "-c", "export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1; RANK=0 python3 {script} & RANK=1 python3 {script} & wait"]
timeout = "10m"
env = {{ MARKER = "{marker}" }}
"#,
            script = script.display()
        ),
    );
    let sub = Scratch::new("rank-failure-bash");
    let run = run_plan_with(orchestrate_with(python), &sub, &plan, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let bash = run.stage("bash");
    assert_eq!(bash["failure"], "rank_failed", "{bash}");
    let error = bash["error"].as_str().unwrap();
    assert!(
        error.contains("rank 1 exited with code 1")
            && error.contains("still ran after the rank_grace of 3s and were stopped"),
        "{error}"
    );
}

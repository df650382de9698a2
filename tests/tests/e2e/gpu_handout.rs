//! How stages are given GPUs and rendezvous ports, and whose fault memory left on a GPU is:
//! real runs of `orchestrate` on stand-in GPUs (`ORCHESTRATE_FAKE_GPUS`, memory read from
//! holder files), with real processes as the holders.

use e2e_tests::{
    fake_gpu_command, orchestrate, output_text as text, read_report, report_stage, wait_for,
    Scratch,
};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `orchestrate --plan` on `gpus` fake GPUs whose holders are read from `holders`.
fn run_on_fake_gpus(s: &Scratch, plan: &Path, gpus: &str, holders: &Path) -> Output {
    fake_gpu_command(s, plan, gpus, holders)
        .output()
        .expect("orchestrate runs")
}

#[test]
fn stages_get_cuda_indices_in_bus_order_with_the_uuids_beside_them() {
    let s = Scratch::new("gpu-env");
    let stage = |name: &str, gpus: u32| {
        format!(
            "[[stage]]\nname = \"{name}\"\ngpus = {gpus}\noutputs = [\"env.txt\"]\ncommand = [\"sh\", \"-c\", \"echo $CUDA_VISIBLE_DEVICES/$CUDA_DEVICE_ORDER/$ORCHESTRATE_GPU_UUIDS > {{output}}/env.txt\"]\n"
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!("{}{}", stage("two", 2), stage("none", 0)),
    );
    let out = run_on_fake_gpus(&s, &plan, "3", &s.path().join("holders"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let read = |stage: &str| {
        std::fs::read_to_string(s.path().join(format!("run/stages/{stage}/output/env.txt")))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(read("two"), "0,1/PCI_BUS_ID/GPU-fake-0,GPU-fake-1");
    // A stage without GPUs sees none, whatever the machine has.
    assert_eq!(read("none"), "/PCI_BUS_ID/");

    // MIG instances can only be named by UUID: a plan can keep them.
    let s = Scratch::new("gpu-env-uuid");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\ncuda_visible_devices = \"uuid\"\n{}",
            stage("two", 2)
        ),
    );
    let out = run_on_fake_gpus(&s, &plan, "2", &s.path().join("holders"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let env = std::fs::read_to_string(s.path().join("run/stages/two/output/env.txt")).unwrap();
    assert_eq!(
        env.trim(),
        "GPU-fake-0,GPU-fake-1/PCI_BUS_ID/GPU-fake-0,GPU-fake-1"
    );
}

/// A stand-in for another user's process on the GPU: a real process outside orchestrate's
/// tree, killed when dropped.
struct Stranger(std::process::Child);

impl Stranger {
    fn start() -> Stranger {
        Stranger(Command::new("sleep").arg("120").spawn().unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn memory_someone_else_takes_during_a_stage_is_not_its_leak_and_the_next_stage_waits() {
    let s = Scratch::new("gpu-taken");
    let holders = s.path().join("holders");
    let started = s.path().join("started");
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
on_leak = "quarantine"
reclaim_timeout = "5s"

[[stage]]
name = "first"
gpus = 1
command = ["sh", "-c", "touch {started}; sleep 2"]

[[stage]]
name = "second"
after = ["first"]
gpus = 1
command = ["sh", "-c", "date +%s.%N > {{output}}/start.txt"]
outputs = ["start.txt"]
"#,
            started = started.display()
        ),
    );
    let run = fake_gpu_command(&s, &plan, "1", &holders)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || started.exists()));
    // While `first` runs, a process that is not orchestrate's takes 3682 MiB of the GPU.
    let stranger = Stranger::start();
    let line = format!("{} sleep {}\n", stranger.pid(), 3682u64 << 20);
    std::fs::write(holders.join("GPU-fake-0"), line).unwrap();
    // It keeps it until well after `first` has ended; then the GPU is empty again.
    let held_since = Instant::now();
    let journal = s.path().join("run/journal.jsonl");
    assert!(wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&journal).is_ok_and(|j| j.contains("\"stage_finished\""))
    }));
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(holders.join("GPU-fake-0"), "").unwrap();
    let freed_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(held_since.elapsed() > Duration::from_secs(1));

    let report = read_report(&s.path().join("run"));
    let first = report_stage(&report, "first");
    assert_eq!(first["status"], "succeeded", "{first}");
    let gpu = &first["gpu"][0];
    assert_eq!(gpu["verdict"], "taken_by_other", "{gpu}");
    let holder = format!("pid {} (sleep) holding 3682 MiB", stranger.pid());
    assert!(
        gpu["holders"][0].as_str().unwrap().contains(&holder),
        "{gpu}"
    );
    // Quarantine did not fire (the only GPU would have ended the run), and `second` started
    // only once the stranger had let go.
    let second_start: f64 =
        std::fs::read_to_string(s.path().join("run/stages/second/output/start.txt"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    assert!(
        second_start >= freed_unix - 0.05,
        "second started at {second_start}, the GPU was freed at {freed_unix}"
    );
    assert_eq!(
        report_stage(&report, "second")["gpu"][0]["verdict"],
        "clean"
    );
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(
        console.contains("busy, not leaked") && console.contains(&holder),
        "{console}"
    );
    assert!(!console.contains("quarantined"), "{console}");
}

#[test]
fn memory_held_by_a_process_of_orchestrate_itself_is_still_a_leak() {
    let s = Scratch::new("gpu-ours");
    let holders = s.path().join("holders");
    // The stage names its parent, orchestrate, as holding 1 GiB: a process of ours.
    let plan = s.write(
        "plan.toml",
        &format!(
            r#"[run]
reclaim_timeout = "1s"

[[stage]]
name = "leaky"
gpus = 1
command = ["sh", "-c", "echo \"$PPID orchestrate 1073741824\" > {}/GPU-fake-0"]
"#,
            holders.display()
        ),
    );
    let out = run_on_fake_gpus(&s, &plan, "1", &holders);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = read_report(&s.path().join("run"));
    let gpu = &report_stage(&report, "leaky")["gpu"][0];
    assert_eq!(gpu["verdict"], "leaked", "{gpu}");
    assert!(
        gpu["note"]
            .as_str()
            .unwrap()
            .contains("a process of this orchestrator"),
        "{gpu}"
    );
}

#[test]
fn status_of_a_live_run_shows_its_running_stage_as_running() {
    let s = Scratch::new("status-live");
    let started = s.path().join("started");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"long\"\ncommand = [\"sh\", \"-c\", \"touch {}; sleep 30\"]\n\n[[stage]]\nname = \"later\"\nafter = [\"long\"]\ncommand = [\"true\"]\n",
            started.display()
        ),
    );
    let (mut child, run_dir) = e2e_tests::spawn_plan(&s, &plan);
    assert!(wait_for(Duration::from_secs(20), || started.exists()));
    // The journal's start record reaches the disk within its group-commit window.
    let mut status = String::new();
    let shown = wait_for(Duration::from_secs(5), || {
        let out = Command::new(orchestrate())
            .arg("status")
            .arg(&run_dir)
            .output()
            .unwrap();
        status = String::from_utf8_lossy(&out.stdout).into_owned();
        status.contains("running (attempt 1")
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(shown, "{status}");
    let long = status.lines().find(|l| l.starts_with("long")).unwrap();
    assert!(!long.contains("did not finish"), "{status}");
    // The stage after it is not running: it shows what a resume would do.
    let later = status.lines().find(|l| l.starts_with("later")).unwrap();
    assert!(
        later.contains("run    (") && !later.contains("running"),
        "{status}"
    );
}

#[test]
fn two_torchrun_stages_side_by_side_each_get_their_own_rendezvous_port() {
    let s = Scratch::new("torchrun-pair");
    let libtorch = e2e_tests::repo_root().join(".libtorch");
    assert!(
        libtorch.join("torch").is_dir(),
        "torch is installed in {} by scripts/setup-libtorch",
        libtorch.display()
    );
    let script = s.write(
        "ddp.py",
        r#"import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
time.sleep(3)  # both stages hold their rendezvous at the same time
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["ORCHESTRATE_OUTPUT_DIR"], "result.txt"), "w") as f:
        f.write(f"{os.environ['MASTER_PORT']} {t.item()} {time.time()}\n")
dist.destroy_process_group()
"#,
    );
    let stage = |name: &str| {
        format!(
            r#"[[stage]]
name = "{name}"
command = ["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "{script}"]
outputs = ["result.txt"]
timeout = "5m"
env = {{ PYTHONPATH = "{libtorch}", PYTHONWARNINGS = "ignore", OMP_NUM_THREADS = "1" }}
"#,
            script = script.display(),
            libtorch = libtorch.display()
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!("[run]\nmax_parallel = 2\n\n{}\n{}", stage("a"), stage("b")),
    );
    let out = Command::new(orchestrate())
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(s.path().join("run"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let result = |stage: &str| -> (u16, f64) {
        let line = std::fs::read_to_string(
            s.path()
                .join(format!("run/stages/{stage}/output/result.txt")),
        )
        .unwrap();
        let mut words = line.split_whitespace();
        let port = words.next().unwrap().parse().unwrap();
        let sum: f64 = words.next().unwrap().parse().unwrap();
        assert_eq!(sum, 3.0, "both ranks took part in {stage}'s all_reduce");
        (port, words.next().unwrap().parse().unwrap())
    };
    let (port_a, _) = result("a");
    let (port_b, _) = result("b");
    assert_ne!(port_a, port_b);
    // They really ran side by side: each stage's span overlaps the other's.
    let report = read_report(&s.path().join("run"));
    let span = |name: &str| {
        let t = &report_stage(&report, name)["timing"];
        (
            t["spawned"].as_f64().unwrap(),
            t["exited"].as_f64().unwrap(),
        )
    };
    let ((a0, a1), (b0, b1)) = (span("a"), span("b"));
    assert!(a0 < b1 && b0 < a1, "a {a0}..{a1}, b {b0}..{b1}");
}

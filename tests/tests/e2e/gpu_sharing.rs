//! Stages sharing a GPU (`gpu_memory`, issue 47 item 2), on a stand-in GPU whose holder files
//! the stages write themselves: four stages share it at once, each judged on its own. The one
//! that leaves a process in a new session holding memory is `leaked`; its neighbours, whose
//! memory was still on the GPU while they were judged, are `clean`; one that used more than it
//! declared is reported.

use e2e_tests::{fake_gpu_command, output_text, read_report, report_stage, Scratch};

/// A sharing stage: lists itself as holding `MIB` MiB of its GPU, waits until all four have
/// started (so they overlap), and with `leak` = 1 starts a process in a new session that holds
/// 1 GiB and outlives it; then takes its own line off and exits.
const SHARE: &str = r#"
name=$1; leak=$2; mib=$3; fake=$4; barrier=$5
d="$fake/$ORCHESTRATE_GPU_UUIDS.d"
mkdir -p "$d" "$barrier"
echo "$$ python $((mib * 1048576))" > "$d/$$"
touch "$barrier/$name"
i=0
while [ "$(ls "$barrier" | wc -l)" -lt 4 ]; do
  i=$((i + 1)); [ $i -gt 1000 ] && exit 9
  sleep 0.02
done
if [ "$leak" = 1 ]; then
  setsid sh -c 'echo "$$ python 1073741824" > "$0/child-$$"; exec sleep 600' "$d" &
  while ! ls "$d" | grep -q child; do sleep 0.02; done
fi
sleep 0.4
rm -f "$d/$$"
"#;

#[test]
fn four_stages_share_a_gpu_and_only_the_one_that_leaves_memory_behind_is_leaked() {
    let s = Scratch::new("gpu-sharing");
    let holders = s.path().join("holders");
    let barrier = s.path().join("barrier");
    let script = s.write("share.sh", SHARE);
    let stage = |name: &str, leak: u8, mib: u64| {
        format!(
            "[[stage]]\nname = \"{name}\"\ngpu_memory = \"10GiB\"\ncommand = [\"sh\", \"{}\", \"{name}\", \"{leak}\", \"{mib}\", \"{}\", \"{}\"]\n",
            script.display(),
            holders.display(),
            barrier.display()
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\nmax_parallel = 4\non_leak = \"warn\"\nreclaim_timeout = \"1s\"\n\n{}{}{}{}",
            stage("a", 0, 2048),
            stage("b", 0, 2048),
            stage("leaky", 1, 2048),
            stage("greedy", 0, 12288),
        ),
    );
    let out = fake_gpu_command(&s, &plan, "1", &holders).output().unwrap();
    let text = output_text(&out);
    // Every stage succeeded; one leaked: "succeeded with leaked GPU memory", exit 3.
    assert_eq!(out.status.code(), Some(3), "{text}");
    let report = read_report(&s.path().join("run"));
    assert_eq!(report["status"], "succeeded_leaked", "{text}");
    for name in ["a", "b", "greedy", "leaky"] {
        let st = report_stage(&report, name);
        assert_eq!(st["status"], "succeeded", "{name}: {st}");
        assert_eq!(st["gpu"][0]["uuid"], "GPU-fake-0", "{name}: {st}");
    }
    for name in ["a", "b", "greedy"] {
        let gpu = &report_stage(&report, name)["gpu"][0];
        assert_eq!(gpu["verdict"], "clean", "{name}: {gpu}\n{text}");
    }
    let leaky = &report_stage(&report, "leaky")["gpu"][0];
    assert_eq!(leaky["verdict"], "leaked", "{leaky}\n{text}");
    let note = leaky["note"].as_str().unwrap_or("");
    assert!(
        note.contains("a process of the stage, still held memory on the shared GPU"),
        "{leaky}"
    );
    // The stage that held 12 GiB against its 10 GiB is reported, its verdict still clean.
    let greedy = &report_stage(&report, "greedy")["gpu"][0];
    assert_eq!(greedy["peak_bytes"], 12u64 << 30, "{greedy}");
    assert!(
        greedy["note"]
            .as_str()
            .unwrap_or("")
            .contains("used 12288 MiB, more than the 10240 MiB it declared"),
        "{greedy}"
    );
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(
        console
            .contains("greedy: used 12288 MiB of GPU memory, more than the 10240 MiB it declared"),
        "{console}"
    );
    // They ran at once: all four were on the barrier together (the script exits 9 otherwise).
    assert_eq!(std::fs::read_dir(&barrier).unwrap().count(), 4);
}

/// A sharing stage whose line stays in the holder file after it exits: as the driver lists an
/// exited process while it tears its context down.
const LINGER: &str = r#"
d="$1/$ORCHESTRATE_GPU_UUIDS.d"
mkdir -p "$d"
echo "$$ python 1073741824" > "$d/$$"
sleep 0.2
"#;

#[test]
fn a_main_process_still_listed_for_a_moment_after_its_exit_is_waited_for_and_not_a_leak() {
    let s = Scratch::new("gpu-sharing-linger");
    let holders = s.path().join("holders");
    let script = s.write("linger.sh", LINGER);
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\nreclaim_timeout = \"5s\"\n\n[[stage]]\nname = \"s\"\ngpu_memory = \"2GiB\"\ncommand = [\"sh\", \"{}\", \"{}\"]\n",
            script.display(),
            holders.display()
        ),
    );
    let mut child = fake_gpu_command(&s, &plan, "1", &holders)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The "driver": each listed process's line goes 0.3 s after its process is gone.
    let listed = holders.join("GPU-fake-0.d");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut taken_off = 0;
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the run did not end");
        for entry in std::fs::read_dir(&listed).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                std::thread::sleep(std::time::Duration::from_millis(300));
                std::fs::remove_file(entry.path()).unwrap();
                taken_off += 1;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let text = output_text(&out);
    assert_eq!(taken_off, 1, "{text}");
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report = read_report(&s.path().join("run"));
    let gpu = &report_stage(&report, "s")["gpu"][0];
    assert_eq!(gpu["verdict"], "clean", "{gpu}");
    // Judged once the line went, not at the end of the 5 s reclaim time.
    assert!(gpu["reclaim_ms"].as_f64().unwrap() < 4000.0, "{gpu}");
}

/// A stage sharing its GPU through MPS: writes the variables that make it an MPS client, and
/// lists itself on the stand-in GPU while it runs (as the driver lists an MPS client).
const MPS_CLIENT: &str = r#"
name=$1; fake=$2; barrier=$3
d="$fake/$ORCHESTRATE_GPU_UUIDS.d"
mkdir -p "$d" "$barrier"
echo "$$ python 1073741824" > "$d/$$"
echo "visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" > "$ORCHESTRATE_OUTPUT_DIR/env.txt"
[ -n "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -p "$CUDA_MPS_PIPE_DIRECTORY/control" ] && touch "$ORCHESTRATE_OUTPUT_DIR/daemon-was-up"
touch "$barrier/$name"
i=0
while [ "$(ls "$barrier" | wc -l)" -lt 3 ]; do
  i=$((i + 1)); [ $i -gt 1000 ] && exit 9
  sleep 0.02
done
rm -f "$d/$$"
"#;

fn mps_plan(s: &Scratch) -> std::path::PathBuf {
    let script = s.write("client.sh", MPS_CLIENT);
    let holders = s.path().join("holders");
    let barrier = s.path().join("barrier");
    let stages: String = ["a", "b", "c"]
        .iter()
        .map(|name| {
            format!(
                "[[stage]]\nname = \"{name}\"\ngpu_memory = \"4GiB\"\ncommand = [\"sh\", \"{}\", \"{name}\", \"{}\", \"{}\"]\n",
                script.display(),
                holders.display(),
                barrier.display()
            )
        })
        .collect();
    s.write(
        "plan.toml",
        &format!(
            "[run]\nmax_parallel = 3\ngpu_sharing = \"mps\"\nreclaim_timeout = \"2s\"\n\n{stages}"
        ),
    )
}

fn stage_env(s: &Scratch, name: &str) -> String {
    std::fs::read_to_string(s.path().join(format!("run/stages/{name}/output/env.txt")))
        .unwrap_or_else(|e| panic!("{name}'s env.txt: {e}"))
}

/// The MPS stand-in that plays NVIDIA's control program (`tests/fixtures`).
fn mps_standin() -> std::path::PathBuf {
    e2e_tests::repo_root().join("tests/fixtures/mps-control-standin.sh")
}

/// [`mps_plan`] run on one stand-in GPU with the MPS stand-in, `env` set over it (it may name
/// another control program): what the run printed, and the stand-in's log (its daemons,
/// servers, quits, crashes).
fn run_mps_plan(s: &Scratch, env: &[(&str, &str)]) -> (std::process::Output, String) {
    let plan = mps_plan(s);
    let log = s.path().join("mps.log");
    let out = fake_gpu_command(s, &plan, "1", &s.path().join("holders"))
        .env("ORCHESTRATE_MPS_CONTROL", mps_standin())
        .env("MPS_STANDIN_LOG", &log)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    (out, said)
}

#[test]
fn stages_sharing_a_gpu_through_mps_are_clients_of_one_daemon_that_is_gone_after_them() {
    let s = Scratch::new("gpu-sharing-mps");
    let (out, said) = run_mps_plan(&s, &[]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report = read_report(&s.path().join("run"));
    for name in ["a", "b", "c"] {
        let gpu = &report_stage(&report, name)["gpu"][0];
        assert_eq!(gpu["verdict"], "clean", "{name}: {gpu}\n{text}");
        assert!(
            s.path()
                .join(format!("run/stages/{name}/output/daemon-was-up"))
                .exists(),
            "{name} started before its daemon's control socket existed\n{text}"
        );
    }
    // One daemon for the GPU, seeing that GPU only; its server started once; told to quit.
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{said}");
    assert!(
        lines[0].starts_with("daemon ") && lines[0].contains("gpu=GPU-fake-0"),
        "{said}"
    );
    assert!(lines[1].starts_with("server "), "{said}");
    assert!(lines[2].starts_with("quit "), "{said}");
    // Every stage was its client, the GPU named as the daemon shows it (device 0).
    let first = stage_env(&s, "a");
    let pipe = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pipe="))
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| panic!("no MPS pipe directory: {first}"))
        .to_string();
    for name in ["a", "b", "c"] {
        let env = stage_env(&s, name);
        assert!(env.starts_with("visible=0 "), "{name}: {env}");
        assert!(env.contains(&format!("pipe={pipe} ")), "{name}: {env}");
    }
    // Nothing of it is left: the daemon and its server are gone, and so is their directory.
    for pid in lines[..2]
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
    {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} is still there: {said}"
        );
    }
    let dir = std::path::Path::new(&pipe).parent().unwrap();
    assert!(!dir.exists(), "{} was left behind", dir.display());
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(
        console.contains("GPU 0 (GPU-fake-0), through MPS"),
        "{console}"
    );
}

/// A daemon that ends on its own leaves its server running: the next stage's start replaces
/// the daemon and kills what the dead one left, and the run's end kills what the last one
/// left, so no process of any daemon's session outlives the run. (Its three stages start one
/// after another, each after the daemon before has ended: three daemons, two replaced.)
#[test]
fn what_a_crashed_mps_daemon_left_is_killed_when_it_is_replaced_and_at_the_end() {
    let s = Scratch::new("gpu-sharing-mps-crash");
    let (out, said) = run_mps_plan(&s, &[("MPS_STANDIN_CRASH", "1")]);
    let text = output_text(&out);
    let pids = |kind: &str| -> Vec<String> {
        said.lines()
            .filter(|l| l.starts_with(kind))
            .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
            .collect()
    };
    let (daemons, servers) = (pids("daemon "), pids("server "));
    assert!(!daemons.is_empty(), "{said}\n{text}");
    assert_eq!(daemons, pids("crash "), "every daemon crashed: {said}");
    assert_eq!(servers.len(), daemons.len(), "{said}");
    for daemon in &daemons {
        let left = e2e_tests::session_members(daemon.parse().unwrap());
        assert!(
            left.is_empty(),
            "daemon {daemon}'s session: {left:?}\n{said}\n{text}"
        );
    }
    for server in &servers {
        assert!(
            !std::path::Path::new(&format!("/proc/{server}")).exists(),
            "server {server} is still there: {said}"
        );
    }
}

#[test]
fn without_an_mps_control_program_stages_share_by_time_slicing_and_say_why() {
    let s = Scratch::new("gpu-sharing-no-mps");
    let missing = s.path().join("no-such-mps-control");
    let (out, _) = run_mps_plan(
        &s,
        &[("ORCHESTRATE_MPS_CONTROL", missing.to_str().unwrap())],
    );
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for name in ["a", "b", "c"] {
        let env = stage_env(&s, name);
        assert!(
            env.contains("pipe= "),
            "{name} was given an MPS pipe: {env}"
        );
        assert!(env.starts_with("visible=0 "), "{name}: {env}");
    }
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(
        console.contains("time-sliced (no MPS: `") && console.contains("is not installed here"),
        "{console}"
    );
}

/// A daemon's runs that share a GPU through MPS, one after the other: each run's stages are
/// clients of a daemon started for them and stopped after them, and both daemons have the
/// same directory, so the stages' environment (what a zygote is keyed by) is the same.
#[test]
fn a_daemon_s_mps_runs_have_a_daemon_each_in_one_directory() {
    let s = Scratch::new("gpu-sharing-mps-daemon");
    let plan = std::fs::read_to_string(mps_plan(&s)).unwrap();
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    let log = s.path().join("mps.log");
    let standin = mps_standin();
    let d = e2e_tests::daemon::TestDaemon::start_in_with(
        s.path(),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &[],
        &[
            ("ORCHESTRATE_FAKE_GPUS", "1"),
            ("ORCHESTRATE_FAKE_GPU_DIR", holders.to_str().unwrap()),
            ("ORCHESTRATE_MPS_CONTROL", standin.to_str().unwrap()),
            ("MPS_STANDIN_LOG", log.to_str().unwrap()),
        ],
    );
    let mut c = d.connect();
    let mut pipes = Vec::new();
    for _ in 0..2 {
        let id = c.submit_toml(&plan, s.path());
        let run = c.wait(&id);
        assert_eq!(run["state"], "succeeded", "{run}\n{}", d.log());
        let dir = std::path::PathBuf::from(run["run_dir"].as_str().unwrap());
        let env = std::fs::read_to_string(dir.join("stages/a/output/env.txt")).unwrap();
        let pipe = env
            .split_whitespace()
            .find_map(|w| w.strip_prefix("pipe="))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| panic!("no MPS pipe directory: {env}"))
            .to_string();
        pipes.push(pipe);
    }
    assert_eq!(
        pipes[0], pipes[1],
        "the second run's daemon had another directory"
    );
    let said = std::fs::read_to_string(&log).unwrap();
    let kinds: Vec<&str> = said
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        kinds,
        ["daemon", "server", "quit", "daemon", "server", "quit"],
        "{said}"
    );
}

/// A stage that shares a GPU gets one hardware work queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`:
/// contexts made at once on one GPU queue less), unless its plan sets the variable; a stage
/// that takes its GPU whole is left with the driver's default.
#[test]
fn sharing_stages_get_one_work_queue_unless_the_plan_says_otherwise() {
    let s = Scratch::new("gpu-sharing-connections");
    let holders = s.path().join("holders");
    let script = s.write(
        "env.sh",
        "echo \"connections=${CUDA_DEVICE_MAX_CONNECTIONS-unset}\" > \"$ORCHESTRATE_OUTPUT_DIR/env.txt\"\n",
    );
    let stage = |name: &str, extra: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\n{extra}\ncommand = [\"sh\", \"{}\"]\n",
            script.display()
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\nmax_parallel = 2\n\n{}{}{}",
            stage("shared", "gpu_memory = \"4GiB\""),
            stage(
                "shared_own",
                "gpu_memory = \"4GiB\"\nenv = { CUDA_DEVICE_MAX_CONNECTIONS = \"4\" }"
            ),
            stage("whole", "gpus = 1\nafter = [\"shared\", \"shared_own\"]"),
        ),
    );
    let out = fake_gpu_command(&s, &plan, "1", &holders)
        .env_remove("CUDA_DEVICE_MAX_CONNECTIONS")
        .output()
        .unwrap();
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(stage_env(&s, "shared").trim(), "connections=1", "{text}");
    assert_eq!(
        stage_env(&s, "shared_own").trim(),
        "connections=4",
        "{text}"
    );
    assert_eq!(stage_env(&s, "whole").trim(), "connections=unset", "{text}");
}

//! A run that leaked GPU memory never looks like a success (issue 47, item 3): it ends
//! "succeeded with leaked GPU memory", amber, on the console's last line, in `runs`, `wait`
//! and the report, with exit status 3; and `orchestrate gpu release` gives a quarantined GPU
//! back only once the driver shows it empty, naming the holder otherwise. On stand-in GPUs
//! whose holder files the stages write.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::{fake_gpu_command, orchestrate, output_text, read_report, Scratch};
use std::path::Path;
use std::process::{Command, Output};

/// Amber, as the terminal shows it (`table::paint`).
const AMBER: &str = "\x1b[1;33m";

/// A one-stage plan whose stage names orchestrate (its parent) as holding 1 GiB of
/// `GPU-fake-0`: memory held by a process of the orchestrator itself, a leak.
fn leaky_plan(s: &Scratch, holders: &Path, on_leak: &str) -> std::path::PathBuf {
    s.write(
        "leaky.toml",
        &format!(
            r#"[run]
on_leak = "{on_leak}"
reclaim_timeout = "1s"

[[stage]]
name = "leaky"
gpus = 1
command = ["sh", "-c", "echo \"$PPID orchestrate 1073741824\" > {}/GPU-fake-0"]
"#,
            holders.display()
        ),
    )
}

fn last_line(text: &str) -> &str {
    text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("")
}

#[test]
fn a_leak_under_warn_ends_the_run_amber_with_exit_3_on_the_console_and_in_the_report() {
    let s = Scratch::new("leak-console");
    let holders = s.path().join("holders");
    let plan = leaky_plan(&s, &holders, "warn");
    let out = fake_gpu_command(&s, &plan, "1", &holders)
        .env("CLICOLOR_FORCE", "1")
        .output()
        .unwrap();
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(3), "{text}");
    let console = String::from_utf8_lossy(&out.stderr);
    let last = last_line(&console);
    assert!(
        last.starts_with(&format!(
            "{AMBER}run succeeded with leaked GPU memory: `leaky` left 1024 MiB on GPU-fake-0"
        )),
        "the console's last line: {last:?}\n{text}"
    );
    assert!(
        !console.contains("\x1b[1;32m"),
        "nothing is green: {console:?}"
    );
    let report = read_report(&s.path().join("run"));
    assert_eq!(report["status"], "succeeded_leaked", "{report}");
    assert_eq!(report["stages"][0]["status"], "succeeded");
    // `orchestrate report` ends the same way.
    let shown = Command::new(orchestrate())
        .arg("report")
        .arg(s.path().join("run"))
        .env("CLICOLOR_FORCE", "1")
        .output()
        .unwrap();
    let shown_text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        last_line(&shown_text).starts_with(&format!(
            "{AMBER}run succeeded with leaked GPU memory: `leaky`"
        )),
        "{shown_text}"
    );
    // Without a terminal and without CLICOLOR_FORCE: the same words, no colour.
    let plain = Command::new(orchestrate())
        .arg("report")
        .arg(s.path().join("run"))
        .env_remove("CLICOLOR_FORCE")
        .output()
        .unwrap();
    let plain_text = String::from_utf8_lossy(&plain.stdout);
    assert!(
        last_line(&plain_text).starts_with("run succeeded with leaked GPU memory: `leaky`"),
        "{plain_text}"
    );
}

/// `orchestrate SUBCOMMAND … --socket SOCKET` with colour forced.
fn client(d: &TestDaemon, args: &[&str]) -> Output {
    Command::new(orchestrate())
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .env("CLICOLOR_FORCE", "1")
        .output()
        .unwrap()
}

#[test]
fn the_daemon_shows_a_leaked_run_amber_and_gpu_release_gives_the_gpu_back_only_when_empty() {
    let s = Scratch::new("leak-daemon");
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    let d = TestDaemon::start_in_with(
        s.path(),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &[],
        &[
            ("ORCHESTRATE_FAKE_GPUS", "1"),
            ("ORCHESTRATE_FAKE_GPU_DIR", holders.to_str().unwrap()),
        ],
    );
    let plan = leaky_plan(&s, &holders, "quarantine");
    let mut c = d.connect();
    let toml = std::fs::read_to_string(&plan).unwrap();
    let id = c.submit_toml(&toml, s.path());
    let run = c.wait(&id);
    assert_eq!(run["state"], "succeeded_leaked", "{run}");
    assert_eq!(run["exit_code"], 3, "{run}");

    // `runs` and `wait` say it in words, amber.
    let runs = client(&d, &["runs"]);
    let runs_text = String::from_utf8_lossy(&runs.stdout);
    let row = runs_text
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{}", output_text(&runs)));
    assert!(
        row.contains(&format!("{AMBER}succeeded with leaked GPU memory")),
        "{row:?}"
    );
    let waited = client(&d, &["wait", &id]);
    assert_eq!(waited.status.code(), Some(3), "{}", output_text(&waited));
    let waited_text = String::from_utf8_lossy(&waited.stdout);
    assert!(
        waited_text.contains(&format!("{id}: {AMBER}succeeded with leaked GPU memory")),
        "{waited_text:?}"
    );

    // The GPU is quarantined and still held by the daemon's own process: release refused,
    // naming it, and the GPU stays quarantined.
    let refused = client(&d, &["gpu", "release", "0"]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{}", output_text(&refused));
    assert!(
        why.contains(&format!("pid {} (orchestrate)", d.pid())) && why.contains("still held"),
        "{why}"
    );
    let again = c.call(serde_json::json!({"v": 1, "type": "release_gpu", "gpu": "GPU-fake-0"}));
    assert_eq!(again["code"], "refused", "{again}");
    // The Python client says the same.
    let python = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys\nfrom orchestrate_client import Client, DaemonError\n\
             try:\n    Client(sys.argv[1]).release_gpu(0)\nexcept DaemonError as e:\n    print(e.code, e.error)",
        )
        .arg(&d.socket)
        .env("PYTHONPATH", e2e_tests::repo_root().join("python"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&python.stdout);
    assert!(
        said.starts_with("refused ") && said.contains("(orchestrate)"),
        "{}",
        output_text(&python)
    );

    // Its holder gone, the release holds, and a stage runs on the GPU again.
    std::fs::write(holders.join("GPU-fake-0"), "").unwrap();
    let released = client(&d, &["gpu", "release", "0"]);
    assert_eq!(
        released.status.code(),
        Some(0),
        "{}",
        output_text(&released)
    );
    assert!(
        String::from_utf8_lossy(&released.stdout).contains("GPU 0 (GPU-fake-0) released"),
        "{}",
        output_text(&released)
    );
    let next = c.submit_toml(
        "[[stage]]\nname = \"after\"\ngpus = 1\ncommand = [\"sh\", \"-c\", \"echo $ORCHESTRATE_GPU_UUIDS > {output}/gpu.txt\"]\noutputs = [\"gpu.txt\"]\n",
        s.path(),
    );
    let after = c.wait(&next);
    assert_eq!(after["state"], "succeeded", "{after}");
    let gpu = std::fs::read_to_string(
        Path::new(after["run_dir"].as_str().unwrap()).join("stages/after/output/gpu.txt"),
    )
    .unwrap();
    assert_eq!(gpu.trim(), "GPU-fake-0");
    // A GPU that is not quarantined has nothing to release.
    let nothing = client(&d, &["gpu", "release", "0"]);
    assert_eq!(nothing.status.code(), Some(2), "{}", output_text(&nothing));
    assert!(
        String::from_utf8_lossy(&nothing.stderr).contains("is not quarantined"),
        "{}",
        output_text(&nothing)
    );
}

//! Python command stages forked from a zygote (`preload`), end to end with real Python: a
//! forked stage runs as `python SCRIPT` / `python -m MODULE` would, sooner, without importing
//! its preload again, and its tree is reaped like an exec'd stage's; an import-time read of a
//! per-stage variable, a zygote that initialised CUDA, and a zygote killed mid-stage all fall
//! back to exec and leave nothing behind; a zygote still importing is never waited for. The
//! report says which path each stage took. A zygote learns what its stages import themselves
//! (`preload = "auto"` from nothing): its next generation imports it, and leaves out a module
//! that starts a thread at import, naming it.
//!
//! The first stage of a zygote is exec'd while the zygote imports (the run does not wait):
//! tests that need a serving zygote run a `warm` stage first ([`WARM`]), which ends once the
//! zygote has imported.

use e2e_tests::{
    alive, children, cmdline, orchestrate, read_report, report_stage, stage_pids, Scratch,
};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A module whose import takes 1.5 s (a stand-in for `import torch`), remembers the process
/// that imported it, and notes that process and the time it was done in `imported` beside
/// itself.
const HEAVY: &str = "import os, time\ntime.sleep(1.5)\nIMPORTED_IN = os.getpid()\n\
    with open(os.path.join(os.path.dirname(__file__), 'imported'), 'a') as f:\n    \
    f.write(f'{os.getpid()} {time.time()}\\n')\n";

/// The stage that starts a zygote (and is exec'd, the zygote still importing): it ends once
/// another process than itself imported `heavy` after it began (its zygote), and 2 s more
/// for the zygote to check itself and say it is ready. With `ZYGOTE_TEST_NO_ZYGOTE` set it ends at once.
const WARM: &str = r#"import os, sys, time
began = time.time()
import heavy
if os.environ.get("ZYGOTE_TEST_NO_ZYGOTE"):
    sys.exit(0)
marks = os.path.join(os.path.dirname(heavy.__file__), "imported")
end = time.time() + 60
def others():
    with open(marks) as f:
        rows = [line.split() for line in f if line.strip()]
    return [r for r in rows if int(r[0]) != os.getpid() and float(r[1]) > began - 5]
while not others():
    if time.time() > end:
        sys.exit("no zygote imported heavy")
    time.sleep(0.05)
# The zygote's own checks after its imports (a probe fork, its maps read) take a moment more,
# several times longer on a loaded machine.
time.sleep(2.0)
# With WARM_UNTIL_STANDBY (a zygote cache directory): until a zygote's log there says that a
# standby is ready (up to 60 s).
until = os.environ.get("WARM_UNTIL_STANDBY")
def standby_ready():
    if not os.path.isdir(until):
        return False
    logs = [os.path.join(until, f) for f in os.listdir(until) if f.endswith(".log")]
    return any("standby ready" in open(log).read() for log in logs)
end = time.time() + 60
while until and not standby_ready() and time.time() < end:
    time.sleep(0.05)
"#;

/// A `warm` stage (see [`WARM`]) named `name`, with `extra` TOML lines (its `preload`, `after`)
/// and the environment its zygote is keyed by.
fn warm_stage(name: &str, extra: &str, env: &str) -> String {
    format!("[[stage]]\nname = \"{name}\"\n{extra}command = [\"python3\", \"warm.py\"]\nenv = {env}\n\n")
}

/// A stage script (its first line of its own after `import heavy`): prints what `python SCRIPT` promises, starts a grandchild in a session of
/// its own that would outlive it, and exits 0.
const STAGE: &str = r#"import heavy
import json, os, subprocess, sys, time
first_line = time.time()
sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
def opens_terminal():
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
        return True
    except OSError:
        return False
print(json.dumps({
    "first_line": first_line,
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "cwd": os.getcwd(),
    "pid": os.getpid(),
    "imported_in": heavy.IMPORTED_IN,
    "stage": os.environ.get("ORCHESTRATE_STAGE"),
    "plan_var": os.environ.get("PLAN_VAR"),
    "grandchild": sleeper.pid,
    "leads_its_group": os.getpgid(0) == os.getpid(),
    "opens_terminal": opens_terminal(),
}))
"#;

fn python_available() {
    let ok = Command::new("python3")
        .arg("-c")
        .arg("import socket; socket.recv_fds")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "these tests need python3 (3.9 or later) on PATH");
}

fn write_modules(s: &Scratch) {
    s.write("mods/heavy.py", HEAVY);
    s.write("mods/stagemod.py", STAGE);
    s.write("stage.py", STAGE);
    s.write("warm.py", WARM);
}

/// Runs `plan`; what its zygotes learn is kept beside `run_dir`, not in the user's cache.
fn run(plan: &Path, run_dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(orchestrate());
    cmd.arg("--plan").arg(plan).arg("--run-dir").arg(run_dir);
    cmd.env(
        "ORCHESTRATE_ZYGOTE_CACHE",
        run_dir.parent().unwrap().join("zygote-cache"),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("orchestrate runs")
}

fn stdout_json(run_dir: &Path, stage: &str) -> Value {
    let path = run_dir.join("stages").join(stage).join("stdout.log");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn stage_start(run_dir: &Path, stage: &str) -> Value {
    report_stage(&read_report(run_dir), stage)["start"].clone()
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_forked_stage_runs_like_python_would_sooner_and_is_reaped_like_an_exec_d_one() {
    python_available();
    let s = Scratch::new("zygote-like-exec");
    write_modules(&s);
    let mods = s.path().join("mods");
    let env = format!(
        "{{ PYTHONPATH = \"{}\", PLAN_VAR = \"x\" }}",
        mods.display()
    );
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\"]\n\n{warm}\
             [[stage]]\nname = \"script\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"stage.py\", \"--lr\", \"3\"]\n\
             env = {{ PYTHONPATH = \"{m}\", PLAN_VAR = \"x\" }}\n\n\
             [[stage]]\nname = \"module\"\nafter = [\"script\"]\ncommand = [\"python3\", \"-m\", \"stagemod\", \"a b\"]\n\
             env = {{ PYTHONPATH = \"{m}\", PLAN_VAR = \"x\" }}\n",
            m = mods.display(),
            warm = warm_stage("warm", "", &env),
        ),
    );
    let zygote_dir = s.path().join("zygote");
    ok(&run(&plan, &zygote_dir, &[]));
    let exec_dir = s.path().join("exec");
    ok(&run(
        &plan,
        &exec_dir,
        &[("ORCHESTRATE_ZYGOTE", "0"), ("ZYGOTE_TEST_NO_ZYGOTE", "1")],
    ));
    // The stage that started the zygote was exec'd: the run did not wait for the imports.
    let warm = stage_start(&zygote_dir, "warm");
    assert_eq!(warm["via"], "exec", "{warm}");
    assert!(
        warm["fallback"]
            .as_str()
            .unwrap()
            .contains("still importing its preload modules"),
        "{warm}"
    );

    let cwd = std::fs::canonicalize(s.path()).unwrap();
    for name in ["script", "module"] {
        let (forked, exec) = (stdout_json(&zygote_dir, name), stdout_json(&exec_dir, name));
        // The report says which path each took, and which generation forked it.
        let start = stage_start(&zygote_dir, name);
        assert_eq!(start["via"], "zygote", "{start}");
        assert!(start["generation"].as_u64().is_some(), "{start}");
        assert!(start.get("fallback").is_none(), "{start}");
        let fell_back = stage_start(&exec_dir, name);
        assert_eq!(fell_back["via"], "exec", "{fell_back}");
        assert!(
            fell_back["fallback"]
                .as_str()
                .unwrap()
                .contains("turned off"),
            "{fell_back}"
        );
        // What `python SCRIPT` / `python -m MODULE` promise, the same on both paths.
        for key in [
            "argv",
            "path0",
            "name",
            "cwd",
            "stage",
            "plan_var",
            "leads_its_group",
            "opens_terminal",
        ] {
            assert_eq!(forked[key], exec[key], "{name}: {key}");
        }
        assert_eq!(forked["name"], "__main__");
        assert_eq!(forked["stage"], name);
        // The leader of a process group of its own (a forked stage leads a session too: it
        // cannot join orchestrate's), with no terminal to open, on both paths.
        assert_eq!(forked["leads_its_group"], true, "its own process group");
        assert_eq!(forked["opens_terminal"], false, "a terminal");
        assert_eq!(forked["cwd"], cwd.display().to_string());
        // The preload ran in the zygote, not in the forked stage; exec imported it itself.
        assert_ne!(forked["imported_in"], forked["pid"], "{forked}");
        assert_eq!(exec["imported_in"], exec["pid"], "{exec}");
        // Its first line came without the 1.5 s import; exec paid it.
        {
            let spawned = |dir: &Path| {
                report_stage(&read_report(dir), name)["timing"]["spawned"]
                    .as_f64()
                    .unwrap()
            };
            let via_zygote = forked["first_line"].as_f64().unwrap() - spawned(&zygote_dir);
            let via_exec = exec["first_line"].as_f64().unwrap() - spawned(&exec_dir);
            assert!(via_zygote < 1.0, "first line {via_zygote:.3} s after spawn");
            assert!(via_exec > 1.5, "exec imports: {via_exec:.3} s");
        }
        // Its daemonised grandchild was found and stopped, as an exec'd stage's is.
        for (dir, out) in [(&zygote_dir, &forked), (&exec_dir, &exec)] {
            let grandchild = out["grandchild"].as_i64().unwrap() as i32;
            assert!(
                !alive(grandchild),
                "{name}: grandchild {grandchild} outlived its stage"
            );
            let st = report_stage(&read_report(dir), name).clone();
            assert_eq!(st["status"], "succeeded", "{st}");
            assert_eq!(
                st["leftover_processes"],
                serde_json::json!([format!("pid {grandchild} (sleep)")]),
                "{st}"
            );
        }
    }
    assert_eq!(
        stdout_json(&zygote_dir, "module")["argv"][1],
        "a b",
        "arguments pass through"
    );
    for pid in stage_pids(&zygote_dir) {
        assert!(!alive(pid), "stage process {pid} outlived the run");
    }
}

#[test]
fn an_import_time_read_of_a_per_stage_variable_or_another_command_falls_back_to_exec() {
    python_available();
    let s = Scratch::new("zygote-env-read");
    write_modules(&s);
    // Reads the stage's name while being imported: a zygote cannot have it right.
    s.write(
        "mods/readsenv.py",
        "import os\nSTAGE_AT_IMPORT = os.environ.get('ORCHESTRATE_STAGE')\n",
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\"]\n\n{warm}{warm_reads}\
             [[stage]]\nname = \"plain\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"reads\"\nafter = [\"warm_reads\"]\npreload = [\"heavy\", \"readsenv\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"options\"\ncommand = [\"python3\", \"-u\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"shell\"\ncommand = [\"sh\", \"-c\", \"exit 0\"]\n",
            m = s.path().join("mods").display(),
            warm = warm_stage("warm", "", &env),
            warm_reads = warm_stage(
                "warm_reads",
                "preload = [\"heavy\", \"readsenv\"]\n",
                &env
            ),
        ),
    );
    let run_dir = s.path().join("run");
    let out = run(&plan, &run_dir, &[]);
    ok(&out);
    assert_eq!(stage_start(&run_dir, "plain")["via"], "zygote");
    let reads = stage_start(&run_dir, "reads");
    assert_eq!(reads["via"], "exec", "{reads}");
    let why = reads["fallback"].as_str().unwrap();
    assert!(
        why.contains("`ORCHESTRATE_STAGE`") && why.contains("\"reads\""),
        "{why}"
    );
    // Exec'd, the stage imported its preload itself.
    let st = stdout_json(&run_dir, "reads");
    assert_eq!(st["imported_in"], st["pid"], "{st}");
    let options = stage_start(&run_dir, "options");
    assert!(
        options["fallback"]
            .as_str()
            .unwrap()
            .contains("not `python SCRIPT"),
        "{options}"
    );
    let shell = stage_start(&run_dir, "shell");
    assert!(
        shell["fallback"]
            .as_str()
            .unwrap()
            .contains("`sh` is not a Python interpreter"),
        "{shell}"
    );
    // The console says it too.
    let console = String::from_utf8_lossy(&out.stderr);
    assert!(
        console.contains("plain: started") && console.contains("forked from the zygote"),
        "{console}"
    );
    assert!(
        console.contains("exec'd: the preload imports read `ORCHESTRATE_STAGE`"),
        "{console}"
    );
}

#[test]
fn a_zygote_that_initialised_cuda_refuses_to_serve() {
    python_available();
    let s = Scratch::new("zygote-cuda");
    write_modules(&s);
    // On a machine without a GPU, "CUDA was initialised in the zygote" is simulated by the
    // flag file the zygote's check treats as such (on a GPU host the same check looks at
    // torch.cuda.is_initialized(), the CUDA driver and the NVIDIA device files it holds).
    // `initcuda` stands for a preload module whose import initialises CUDA: it creates it.
    let flag = s.path().join("cuda-initialised");
    s.write(
        "mods/initcuda.py",
        &format!("open({:?}, 'w').close()\n", flag.display().to_string()),
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\"]\n\n{warm}{warm_touches}\
             [[stage]]\nname = \"before\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"touches\"\nafter = [\"warm_touches\"]\npreload = [\"heavy\", \"initcuda\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"after\"\nafter = [\"touches\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n",
            m = s.path().join("mods").display(),
            warm = warm_stage("warm", "", &env),
            // The zygote whose import initialises CUDA is started once `before` was forked.
            warm_touches = warm_stage(
                "warm_touches",
                "after = [\"before\"]\npreload = [\"heavy\", \"initcuda\"]\n",
                &env
            ),
        ),
    );
    let run_dir = s.path().join("run");
    let flag_var = flag.display().to_string();
    ok(&run(
        &plan,
        &run_dir,
        &[("STAGE_WORKER_SIMULATED_DEVICE_FLAG", &flag_var)],
    ));
    assert_eq!(stage_start(&run_dir, "before")["via"], "zygote");
    // The zygote whose import "initialised CUDA" refused at once...
    let touches = stage_start(&run_dir, "touches");
    assert_eq!(touches["via"], "exec", "{touches}");
    let why = touches["fallback"].as_str().unwrap();
    assert!(
        why.contains("a device was initialised in the zygote"),
        "{touches}"
    );
    assert!(
        why.contains("after importing `initcuda`"),
        "the culprit is named: {touches}"
    );
    // ...and the first zygote, checking again before its next fork, refused too.
    let after = stage_start(&run_dir, "after");
    assert_eq!(after["via"], "exec", "{after}");
    assert!(
        after["fallback"]
            .as_str()
            .unwrap()
            .contains("a device was initialised in the zygote"),
        "{after}"
    );
    for name in ["before", "touches", "after"] {
        assert_eq!(
            report_stage(&read_report(&run_dir), name)["status"],
            "succeeded"
        );
    }
}

#[test]
fn killing_the_zygote_mid_stage_leaves_nothing_behind() {
    python_available();
    let s = Scratch::new("zygote-kill");
    write_modules(&s);
    let release = s.path().join("release");
    s.write(
        "wait.py",
        &format!(
            "import os, subprocess, time\nimport heavy\n\
             child = subprocess.Popen(['sleep', '300'])\nprint(child.pid, flush=True)\n\
             while not os.path.exists({:?}):\n    time.sleep(0.02)\n",
            release.display().to_string()
        ),
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\"]\n\n{warm}\
             [[stage]]\nname = \"a\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"wait.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"python3\", \"stage.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n",
            m = s.path().join("mods").display(),
            warm = warm_stage("warm", "", &env),
        ),
    );
    let (orch, run_dir) = e2e_tests::spawn_plan_piping_stderr(&s, &plan);
    let orch_pid = orch.id() as i32;
    let a_out = run_dir.join("stages/a/stdout.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (zygote, stage_a, grandchild) = loop {
        assert!(Instant::now() < deadline, "stage a never started");
        let zygote = children(orch_pid)
            .into_iter()
            .find(|&p| cmdline(p).contains("orchestrate's zygote"));
        let printed = std::fs::read_to_string(&a_out).unwrap_or_default();
        if let (Some(z), Some(a), Ok(g)) = (
            zygote,
            e2e_tests::journal_records(&run_dir)
                .iter()
                .find(|r| r["rec"] == "stage_started" && r["stage"] == "a")
                .and_then(|r| r["pid"].as_i64())
                .map(|p| p as i32),
            printed.trim().parse::<i32>(),
        ) {
            break (z, a, g);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive(stage_a) && alive(grandchild));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        e2e_tests::wait_for(Duration::from_secs(5), || !alive(zygote)),
        "the zygote is gone"
    );
    assert!(
        alive(stage_a),
        "the running stage is not the zygote's to take along"
    );
    std::fs::write(&release, "").unwrap();
    let out = orch.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stage_start(&run_dir, "a")["via"], "zygote");
    let b = stage_start(&run_dir, "b");
    assert_eq!(b["via"], "exec", "{b}");
    assert!(
        b["fallback"]
            .as_str()
            .unwrap()
            .contains("the zygote cannot serve"),
        "{b}"
    );
    let report = read_report(&run_dir);
    assert_eq!(report_stage(&report, "a")["status"], "succeeded");
    assert_eq!(report_stage(&report, "b")["status"], "succeeded");
    let b_grandchild = stdout_json(&run_dir, "b")["grandchild"].as_i64().unwrap() as i32;
    for pid in stage_pids(&run_dir)
        .into_iter()
        .chain([zygote, grandchild, b_grandchild])
    {
        assert!(!alive(pid), "pid {pid} ({}) outlived the run", cmdline(pid));
    }
}

/// A zygote whose imports take long is never waited for: the stage that started it and the
/// next one are exec'd at once, the run's other stages go on meanwhile, and the run ends
/// before the zygote could have been ready, leaving no zygote behind.
#[test]
fn a_zygote_still_importing_is_not_waited_for_and_the_run_goes_on() {
    python_available();
    let s = Scratch::new("zygote-importing");
    const IMPORT_S: f64 = 6.0;
    s.write(
        "mods/zygote_slow_import.py",
        &format!("import time\ntime.sleep({IMPORT_S})\n"),
    );
    s.write("quick.py", "print('quick')\n");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"zygote_slow_import\"]\n\n\
             [[stage]]\nname = \"first\"\ncommand = [\"python3\", \"quick.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"second\"\nafter = [\"first\"]\ncommand = [\"python3\", \"quick.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"q1\"\ncommand = [\"true\"]\n\n\
             [[stage]]\nname = \"q2\"\nafter = [\"q1\"]\ncommand = [\"true\"]\n\n\
             [[stage]]\nname = \"q3\"\nafter = [\"q2\"]\ncommand = [\"true\"]\n",
            m = s.path().join("mods").display()
        ),
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[]));
    for name in ["first", "second"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "exec", "{name}: {start}");
        assert!(
            start["fallback"]
                .as_str()
                .unwrap()
                .contains("still importing its preload modules"),
            "{name}: {start}"
        );
    }
    // Waiting for the zygote's Ready would have held the run for the whole import.
    let report = read_report(&run_dir);
    let timing = |name: &str, key: &str| {
        report_stage(&report, name)["timing"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} {key}"))
    };
    let began = timing("first", "spawned").min(timing("q1", "spawned"));
    let ended = ["second", "q3"]
        .iter()
        .map(|n| timing(n, "exited"))
        .fold(0.0, f64::max);
    assert!(
        ended - began < IMPORT_S,
        "the run took {:.2} s, as long as the zygote's imports",
        ended - began
    );
    let left: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&p| {
            let line = cmdline(p);
            line.contains("orchestrate's zygote") && line.contains("zygote_slow_import")
        })
        .collect();
    assert!(left.is_empty(), "zygotes left behind: {left:?}");
}

/// A preloaded module that starts a thread which holds a lock most of the time (as a
/// library's background worker does): a stage forked from there would inherit the lock held,
/// with no thread left to release it, and hang. The zygote leaves it out (execs itself afresh
/// without it), naming the import and the thread; its stages are still forked, import it
/// themselves and take the lock in a moment.
#[test]
fn a_preload_that_starts_a_thread_is_left_out_and_its_stages_import_it_themselves() {
    python_available();
    let s = Scratch::new("zygote-thread");
    write_modules(&s);
    s.write(
        "mods/locker.py",
        "import threading, time\nLOCK = threading.Lock()\n\
         def _hold():\n    while True:\n        with LOCK:\n            time.sleep(0.2)\n        time.sleep(0.001)\n\
         threading.Thread(target=_hold, name='locker-holds', daemon=True).start()\n",
    );
    s.write(
        "lock.py",
        "import locker\nwith locker.LOCK:\n    print('took the lock', flush=True)\n",
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let stage = |name: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"lock.py\"]\n\
             timeout = \"30s\"\nenv = {env}\n\n"
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\", \"locker\"]\n\n{}{}{}",
            warm_stage("warm", "", &env),
            stage("a"),
            stage("b"),
        ),
    );
    let run_dir = s.path().join("run");
    let out = run(&plan, &run_dir, &[]);
    ok(&out);
    let report = read_report(&run_dir);
    for name in ["a", "b"] {
        let st = report_stage(&report, name);
        assert_eq!(st["status"], "succeeded", "{st}");
        // Forked from the zygote that preloads the rest of the list...
        let start = &st["start"];
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        // ...with the culprit named, and why, among the modules it left out...
        let left_out = start["left_out"].as_array().unwrap();
        assert_eq!(left_out.len(), 1, "{name}: {start}");
        assert_eq!(left_out[0]["module"], "locker", "{name}: {start}");
        let why = left_out[0]["reason"].as_str().unwrap();
        assert!(
            why.contains("Python threads") && why.contains("locker-holds"),
            "{name}: why is said: {why}"
        );
        // ...which the stage imported itself, its thread running in the stage alone.
        let stdout =
            std::fs::read_to_string(run_dir.join("stages").join(name).join("stdout.log")).unwrap();
        assert!(stdout.contains("took the lock"), "{name}: {stdout}");
    }
    let _ = out;
}

/// A preloaded module edited on disk while its zygote serves (a fix, an upgrade under a
/// daemon): the zygote checks its files before every fork, so the next stage is not forked
/// from the old code; it is exec'd with the reason, the zygote is retired, and a fresh one
/// serves the new code to the stages after.
#[test]
fn a_preloaded_module_edited_on_disk_is_never_forked_from_stale() {
    python_available();
    let s = Scratch::new("zygote-stale");
    write_modules(&s);
    let versioned = s.write("mods/versioned.py", "VERSION = 1\n");
    s.write(
        "show.py",
        "import heavy, versioned, json, os\n\
         print(json.dumps({'version': versioned.VERSION, 'pid': os.getpid(), 'imported_in': heavy.IMPORTED_IN}))\n",
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let show = |name: &str, after: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\nafter = [\"{after}\"]\ncommand = [\"python3\", \"show.py\"]\nenv = {env}\n\n"
        )
    };
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\", \"versioned\"]\n\n{warm}{old}\
             [[stage]]\nname = \"edit\"\nafter = [\"old\"]\ncommand = [\"sh\", \"-c\", \"echo 'VERSION = 22' > {path}\"]\n\n\
             {new}{warm2}{fresh}",
            warm = warm_stage("warm", "", &env),
            old = show("old", "warm"),
            path = versioned.display(),
            new = show("new", "edit"),
            warm2 = warm_stage("warm2", "after = [\"new\"]\n", &env),
            fresh = show("fresh", "warm2"),
        ),
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[]));
    let old = stdout_json(&run_dir, "old");
    assert_eq!(stage_start(&run_dir, "old")["via"], "zygote");
    assert_eq!(old["version"], 1, "{old}");
    // The edit is seen before the next fork: exec'd, with the new code and the reason.
    let new = stdout_json(&run_dir, "new");
    assert_eq!(
        new["version"], 22,
        "the stage after the edit ran the old code: {new}"
    );
    let start = stage_start(&run_dir, "new");
    assert_eq!(start["via"], "exec", "{start}");
    let why = start["fallback"].as_str().unwrap();
    assert!(
        why.contains("out of date")
            && why.contains("versioned.py changed since the zygote imported it"),
        "{why}"
    );
    // A fresh zygote imported the new code and serves again.
    let fresh = stdout_json(&run_dir, "fresh");
    assert_eq!(stage_start(&run_dir, "fresh")["via"], "zygote");
    assert_eq!(fresh["version"], 22, "{fresh}");
    assert_ne!(fresh["imported_in"], fresh["pid"], "{fresh}");
    assert_ne!(
        fresh["imported_in"], old["imported_in"],
        "served by the fresh zygote, not the retired one"
    );
    assert!(
        !alive(old["imported_in"].as_i64().unwrap() as i32),
        "the retired zygote is gone"
    );
}

/// Stages forked from one zygote inherit its random generators: without a reseed, numpy's
/// global state (loaded with `numpy.random`) and torch's CPU generator draw the same values in
/// every instance of a sweep. Four forked instances draw four different values from each,
/// as exec'd ones do. Needs numpy and torch: the framework Python (`ORCHESTRATE_TEST_PYTHON`).
#[test]
fn forked_instances_of_a_matrix_draw_different_random_numbers() {
    let Some(python) = e2e_tests::framework_python() else {
        return;
    };
    let s = Scratch::new("zygote-reseed");
    write_modules(&s);
    s.write(
        "draw.py",
        "import json, os, random\nimport numpy as np, torch, heavy\n\
         print(json.dumps({'np': np.random.rand(), 'random': random.random(), 'torch': torch.rand(1).item(), \
         'pid': os.getpid(), 'imported_in': heavy.IMPORTED_IN}))\n",
    );
    // No OMP_NUM_THREADS: OpenBLAS (loaded with numpy) starts its thread pool in the zygote,
    // which forks nonetheless, as a fork stops that pool.
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    // `heavy` last: the warm stage ends once the zygote imported it, so once it imported all.
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"torch\", \"numpy.random\", \"heavy\"]\n\n{warm}\
             [[stage]]\nname = \"draw\"\nafter = [\"warm\"]\nmatrix = {{ i = [1, 2, 3, 4] }}\n\
             command = [\"python3\", \"draw.py\"]\nenv = {env}\n",
            warm = warm_stage("warm", "", &env),
        ),
    );
    let bin = python.parent().expect("the venv's bin directory");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[("PATH", &path)]));
    let draws: Vec<Value> = (1..=4)
        .map(|i| {
            let name = format!("draw[i={i}]");
            let start = stage_start(&run_dir, &name);
            assert_eq!(start["via"], "zygote", "{name}: {start}");
            let drew = stdout_json(&run_dir, &name);
            assert_ne!(drew["imported_in"], drew["pid"], "forked: {drew}");
            drew
        })
        .collect();
    for generator in ["np", "random", "torch"] {
        let mut values: Vec<f64> = draws
            .iter()
            .map(|d| d[generator].as_f64().unwrap())
            .collect();
        values.sort_by(f64::total_cmp);
        values.dedup();
        assert_eq!(values.len(), 4, "{generator}: {draws:?}");
    }
}

/// A local module the first stage imports (not preloaded): notes `PID TIME` of each process
/// that imports it in `learnme.marks` beside itself.
const LEARNME: &str = "import os, time\nwith open(os.path.join(os.path.dirname(__file__), 'learnme.marks'), 'a') as f:\n    \
    f.write(f'{os.getpid()} {time.time()}\\n')\n";

/// Starts a thread at import, as a package with a background worker does (its
/// `__init__.py`).
const THREADER: &str = "import threading, time\n\
    threading.Thread(target=lambda: time.sleep(600), name='threader-sleeps', daemon=True).start()\n";

/// The first stage: imports a local module, a standard-library one and a submodule of a
/// package that starts a thread, none of them preloaded.
const TEACHES: &str = "import learnme, decimal, threader.sub\n";

/// Ends once the zygote's next generation says it is ready in its lineage's log (beside what
/// the lineage learned, in the scratch directory's `zygote-cache`): the first generation's
/// line, then the next one's.
const AWAITS_NEXT: &str = r#"import glob, os, sys, time
cache = os.path.join(os.path.dirname(os.environ["MODS"]), "zygote-cache")
end = time.time() + 60
def readies():
    return sum(open(p).read().count(" ready: ") for p in glob.glob(os.path.join(cache, "*.log")))
while readies() < 2:
    if time.time() > end:
        sys.exit("no next generation became ready")
    time.sleep(0.05)
time.sleep(0.5)
"#;

/// The second stage: what was already loaded at its first line.
const SEES: &str = r#"import json, sys
print(json.dumps({m: m in sys.modules for m in ["learnme", "decimal", "threader", "threader.sub"]}))
"#;

/// The learning tests' modules (`learnme`, the `threader` package) and the scripts that teach
/// and wait for the next generation.
fn learning_scripts(s: &Scratch) {
    s.write("mods/learnme.py", LEARNME);
    s.write("mods/threader/__init__.py", THREADER);
    s.write("mods/threader/sub.py", "");
    s.write("teaches.py", TEACHES);
    s.write("awaits.py", AWAITS_NEXT);
}

/// A learning test's stage `name` running `script`, with `after` (a TOML line, or empty) and
/// the modules on its path.
fn learning_stage(s: &Scratch, name: &str, after: &str, script: &str) -> String {
    format!(
        "[[stage]]\nname = \"{name}\"\n{after}command = [\"python3\", \"{script}\"]\n\
         env = {{ PYTHONPATH = \"{m}\", MODS = \"{m}\" }}\n\n",
        m = s.path().join("mods").display()
    )
}

/// The contents of the files with extension `ext` in the zygote cache beside a test's run.
fn cache_files(s: &Scratch, ext: &str) -> Vec<String> {
    std::fs::read_dir(s.path().join("zygote-cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

#[test]
fn a_zygote_learns_what_its_stages_import_and_leaves_out_a_package_that_starts_a_thread() {
    python_available();
    let s = Scratch::new("zygote-learns");
    learning_scripts(&s);
    s.write("sees.py", SEES);
    let stage = |name: &str, after: &str, script: &str| learning_stage(&s, name, after, script);
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = \"auto\"\n\n{}{}{}",
            stage("first", "", "teaches.py"),
            stage("wait", "after = [\"first\"]\n", "awaits.py"),
            stage("second", "after = [\"wait\"]\n", "sees.py"),
        ),
    );
    let run_dir = s.path().join("run");
    let out = run(&plan, &run_dir, &[]);
    ok(&out);
    // "auto": the first zygote imports nothing, is ready at once, and forks the first stage,
    // which imports the three modules itself.
    let first = stage_start(&run_dir, "first");
    assert_eq!(first["via"], "zygote", "{first}");
    assert_eq!(first["generation"], 1, "{first}");
    let imported = &first["imported"];
    assert!(imported["count"].as_u64().unwrap() >= 3, "{first}");
    assert!(
        imported["first"]
            .as_array()
            .unwrap()
            .contains(&Value::from("learnme")),
        "{first}"
    );
    // The next generation imported them before forking the second stage: at its first line
    // the local and the standard-library module are loaded, the thread starter is not.
    let second = stage_start(&run_dir, "second");
    assert_eq!(second["via"], "zygote", "{second}");
    assert_eq!(second["generation"], 2, "{second}");
    let seen = stdout_json(&run_dir, "second");
    assert_eq!(
        seen,
        serde_json::json!({"learnme": true, "decimal": true, "threader": false, "threader.sub": false})
    );
    // The package whose `__init__` starts the thread is left out once, with its submodule
    // (which would import it again), named with why in the report of the stages it forks.
    let left_out = second["left_out"].as_array().unwrap();
    assert_eq!(left_out.len(), 1, "{second}");
    assert_eq!(left_out[0]["module"], "threader");
    let reason = left_out[0]["reason"].as_str().unwrap();
    assert!(reason.contains("threader-sleeps"), "{second}");
    assert!(
        reason.contains("learned submodule threader.sub"),
        "{second}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("forked from the zygote (generation 2)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What was learned is kept for the next run of this interpreter and preload setting (with
    // the package's submodule dropped: it would import the package again), beside the log of
    // what the zygotes did.
    let files = |ext: &str| cache_files(&s, ext);
    let kept = files("json");
    assert_eq!(kept.len(), 1, "{kept:?}");
    let kept: Value = serde_json::from_str(&kept[0]).unwrap();
    let learned = kept["learned"].as_array().unwrap();
    assert!(learned.contains(&Value::from("learnme")), "{kept}");
    assert!(learned.contains(&Value::from("decimal")), "{kept}");
    assert!(!learned.contains(&Value::from("threader.sub")), "{kept}");
    assert_eq!(kept["left_out"][0]["module"], "threader", "{kept}");
    // Found by a throwaway fork of the zygote after one restart, not by a restart per culprit.
    let log = files("log").concat();
    assert!(
        log.contains("leaving out learned module `threader`"),
        "{log}"
    );
    assert_eq!(log.matches("restarting").count(), 1, "{log}");
}

/// Runs a `warm` stage, then `names` in a chain, each running `script` with one GPU (of one
/// stand-in GPU) and `env`, under `[run] preload = PRELOAD`; checks that the run succeeded and
/// returns its directory.
fn gpu_chain(
    s: &Scratch,
    preload: &str,
    env: &str,
    script: &str,
    names: &[&str],
) -> std::path::PathBuf {
    let mut plan = format!(
        "[run]\npreload = {preload}\n\n{}",
        warm_stage("warm", "gpus = 1\n", env)
    );
    let mut after = "warm";
    for name in names {
        plan += &format!(
            "[[stage]]\nname = \"{name}\"\nafter = [\"{after}\"]\ngpus = 1\n\
             command = [\"python3\", \"{script}\"]\nenv = {env}\n\n"
        );
        after = name;
    }
    run_on_a_stand_in_gpu(s, &plan)
}

/// Runs `plan` (TOML) with one stand-in GPU; asserts it succeeded and returns its run
/// directory.
fn run_on_a_stand_in_gpu(s: &Scratch, plan: &str) -> std::path::PathBuf {
    let plan = s.write("plan.toml", plan);
    let run_dir = s.path().join("run");
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    let out = run(
        &plan,
        &run_dir,
        &[
            ("ORCHESTRATE_FAKE_GPUS", "1"),
            ("ORCHESTRATE_FAKE_GPU_DIR", holders.to_str().unwrap()),
        ],
    );
    ok(&out);
    run_dir
}

/// Stages with GPUs share their zygote as stages without do: what orchestrate sets for one
/// attempt alone (the NCCL flight recorder's files, the rendezvous port) is not part of a
/// zygote's key, so the stages after the first are forked, not each given a zygote of its
/// own that is still importing when it starts.
#[test]
fn stages_with_gpus_are_forked_from_one_zygote() {
    python_available();
    let s = Scratch::new("zygote-gpus");
    write_modules(&s);
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let run_dir = gpu_chain(&s, "[\"heavy\"]", &env, "stage.py", &["a", "b"]);
    let warm = stage_start(&run_dir, "warm");
    let zygote_pid = |name: &str| stdout_json(&run_dir, name)["imported_in"].clone();
    for name in ["a", "b"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start} (warm: {warm})");
    }
    assert_eq!(zygote_pid("a"), zygote_pid("b"), "one zygote forked both");
}

/// What a forked stage inherits from its zygote's set-up: the zygote's objects frozen for the
/// collector (`gc.freeze()`, so the stage's collections and exit skip them), and imports that
/// ran with pyarrow's jemalloc told not to start its background thread, while the stage's own
/// environment (and its children's) has no such variable.
#[test]
fn a_forked_stage_starts_with_the_zygote_frozen_and_its_imports_saw_the_native_settings() {
    python_available();
    let s = Scratch::new("zygote-native");
    write_modules(&s);
    s.write(
        "mods/jeconf.py",
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.getenv.restype = ctypes.c_char_p\n\
         SEEN = (libc.getenv(b'JE_ARROW_MALLOC_CONF') or b'').decode()\n",
    );
    s.write(
        "native.py",
        "import gc, json, os, subprocess, sys, jeconf\n\
         child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"JE_ARROW_MALLOC_CONF\"))'],\n\
             capture_output=True, text=True).stdout.strip()\n\
         print(json.dumps({'seen': jeconf.SEEN, 'frozen': gc.get_freeze_count(),\n\
             'env': os.environ.get('JE_ARROW_MALLOC_CONF'), 'child': child}))\n",
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"heavy\", \"jeconf\"]\n\n{}[[stage]]\nname = \"a\"\nafter = [\"warm\"]\n\
             command = [\"python3\", \"native.py\"]\nenv = {env}\n",
            warm_stage("warm", "", &env),
        ),
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[]));
    assert_eq!(stage_start(&run_dir, "a")["via"], "zygote");
    let seen = stdout_json(&run_dir, "a");
    assert_eq!(seen["seen"], "background_thread:false", "{seen}");
    assert!(seen["frozen"].as_u64().unwrap() > 1000, "{seen}");
    assert_eq!(seen["env"], Value::Null, "{seen}");
    assert_eq!(seen["child"], "None", "{seen}");
}

/// A run that ends while its zygote's next generation finishes importing still keeps what that
/// generation found: the module it left out is its lineage's, so the next run's zygote does not
/// import it, find it unfit and restart all over again.
#[test]
fn what_a_generation_left_out_is_kept_when_the_run_ends_before_it_forks() {
    python_available();
    let s = Scratch::new("zygote-kept");
    learning_scripts(&s);
    let stage = |name: &str, after: &str, script: &str| learning_stage(&s, name, after, script);
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = \"auto\"\n\n{}{}",
            stage("first", "", "teaches.py"),
            stage("wait", "after = [\"first\"]\n", "awaits.py"),
        ),
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[]));
    let kept: Vec<Value> = cache_files(&s, "json")
        .iter()
        .map(|text| serde_json::from_str(text).unwrap())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["left_out"][0]["module"], "threader", "{}", kept[0]);
}

/// A script that leaves what the interpreter's exit finishes: a file left open in a module it
/// imported and in its own globals (which its functions keep in a cycle), a non-daemon thread
/// still working, an atexit handler. Each writes a line into `{prefix}-*.txt` in the working
/// directory.
const ENDS_UNTIDY: &str = r#"import atexit, os, sys, threading, time
import untidy
prefix = sys.argv[1]
kept = open(f"{prefix}-script-global.txt", "w")
kept.write("left open by the script\n")
untidy.open_one(prefix)
untidy.linger(prefix)
def late():
    time.sleep(0.5)
    with open(f"{prefix}-thread.txt", "w") as f:
        f.write("a thread joined at exit\n")
threading.Thread(target=late).start()
atexit.register(lambda: open(f"{prefix}-atexit.txt", "w").write("an atexit handler\n"))
"#;

/// A forked stage ends as `python SCRIPT` would: what it left open is written, its non-daemon
/// threads finish, its atexit handlers run, and its exit status (returned, `sys.exit(3)`,
/// `sys.exit("message")`, an uncaught exception with its traceback) is the exec'd stage's;
/// only the interpreter's teardown is skipped.
#[test]
fn a_forked_stage_ends_as_python_would() {
    python_available();
    let s = Scratch::new("zygote-ends");
    write_modules(&s);
    s.write(
        "mods/untidy.py",
        "HELD = []\ndef open_one(prefix):\n    f = open(f'{prefix}-module-global.txt', 'w')\n    \
         f.write('left open in a module\\n')\n    HELD.append(f)\n\
         class Lingers:\n    def __init__(self, path):\n        self.path = path\n    \
         def __del__(self, _open=open):\n        with _open(self.path, 'w') as f:\n            \
         f.write('torn down\\n')\n\
         def linger(prefix):\n    HELD.append(Lingers(f'{prefix}-teardown.txt'))\n",
    );
    s.write("untidy_stage.py", ENDS_UNTIDY);
    s.write("exit3.py", "import sys\nprint('before')\nsys.exit(3)\n");
    s.write(
        "message.py",
        "import sys\nsys.exit('a message for the user')\n",
    );
    s.write(
        "raises.py",
        "def inner():\n    raise ValueError('boom from the stage')\ninner()\n",
    );
    let env = format!("{{ PYTHONPATH = \"{}\" }}", s.path().join("mods").display());
    let stage = |name: &str, args: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\nafter = [\"warm\"]\ncommand = [\"python3\", {args}]\nenv = {env}\n\n"
        )
    };
    let plan = |prefix: &str| {
        s.write(
            &format!("plan-{prefix}.toml"),
            &format!(
                "[run]\npreload = [\"heavy\"]\n\n{}{}{}{}{}",
                warm_stage("warm", "", &env),
                stage("untidy", &format!("\"untidy_stage.py\", \"{prefix}\"")),
                stage("exit3", "\"exit3.py\""),
                stage("message", "\"message.py\""),
                stage("raises", "\"raises.py\""),
            ),
        )
    };
    let zygote_dir = s.path().join("zygote");
    let exec_dir = s.path().join("exec");
    let forked = run(&plan("forked"), &zygote_dir, &[]);
    let exec = run(
        &plan("exec"),
        &exec_dir,
        &[("ORCHESTRATE_ZYGOTE", "0"), ("ZYGOTE_TEST_NO_ZYGOTE", "1")],
    );
    assert_eq!(forked.status.code(), Some(1), "a failed stage: exit code 1");
    assert_eq!(exec.status.code(), Some(1));
    for name in ["untidy", "exit3", "message", "raises"] {
        assert_eq!(stage_start(&zygote_dir, name)["via"], "zygote", "{name}");
    }
    // The interpreter's teardown is what a forked stage skips: the `__del__` of an object a
    // module still holds at exit runs in the exec'd stage only.
    assert!(
        s.path().join("exec-teardown.txt").is_file(),
        "exec'd: torn down"
    );
    assert!(
        !s.path().join("forked-teardown.txt").exists(),
        "forked: the interpreter's teardown ran"
    );
    for what in ["script-global", "module-global", "thread", "atexit"] {
        let read =
            |prefix: &str| std::fs::read_to_string(s.path().join(format!("{prefix}-{what}.txt")));
        let from_exec = read("exec").unwrap_or_else(|e| panic!("exec'd {what}: {e}"));
        assert!(!from_exec.is_empty(), "{what}");
        assert_eq!(
            read("forked").ok().as_ref(),
            Some(&from_exec),
            "forked {what}"
        );
    }
    for dir in [&zygote_dir, &exec_dir] {
        let report = read_report(dir);
        let stage = |name: &str| report_stage(&report, name).clone();
        assert_eq!(
            stage("untidy")["status"],
            "succeeded",
            "{}",
            stage("untidy")
        );
        assert_eq!(stage("exit3")["exit_code"], 3, "{}", stage("exit3"));
        assert_eq!(stage("message")["exit_code"], 1, "{}", stage("message"));
        let tail = |name: &str| {
            stage(name)["stderr_tail"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        assert!(
            tail("message").contains("a message for the user"),
            "{}",
            tail("message")
        );
        assert_eq!(stage("raises")["exit_code"], 1, "{}", stage("raises"));
        for line in [
            "Traceback (most recent call last)",
            "in inner",
            "ValueError: boom from the stage",
        ] {
            assert!(tail("raises").contains(line), "{line}: {}", tail("raises"));
        }
        let out = std::fs::read_to_string(dir.join("stages/exit3/stdout.log")).unwrap();
        assert_eq!(out, "before\n", "stdout flushed before the exit");
    }
}

/// A module that starts a thread at import (so a zygote leaves it out) and notes the process
/// that imported it and when (`READS`: and the stage named in its environment then).
const THREAD_AT_IMPORT: &str = r#"import json, os, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
NOTE = {"pid": os.getpid(), "at": time.time()}
if READS:
    NOTE["stage"] = os.environ.get("ORCHESTRATE_STAGE")
"#;

/// A stage that prints, as JSON, its PID, its first line's time and the note of `MODULE`, and
/// works on for 1 s (time for the next stage's standby to get ready).
const SHOWS_IMPORT: &str = r#"import time
first_line = time.time()
import json, os, sys
module = __import__(os.environ["MODULE"])
print(json.dumps({"pid": os.getpid(), "first_line": first_line, "note": module.NOTE}), flush=True)
time.sleep(1)
"#;

/// How the module a standby imports behaves at import, besides starting a thread.
#[derive(PartialEq)]
enum AtImport {
    /// Nothing else.
    Plain,
    /// It reads `ORCHESTRATE_STAGE`.
    ReadsStage,
    /// It takes 3 s.
    Slow,
    /// It picks its own settings out of the whole environment, as tqdm does at import.
    ScansEnvironment,
}

/// Runs warm, a, b, c in a chain on one stand-in GPU with `preload = ["heavy", MODULE]`, where
/// MODULE starts a thread at import (and does what `at_import` says).
fn standby_chain(name: &str, at_import: AtImport) -> (Scratch, std::path::PathBuf) {
    python_available();
    let s = Scratch::new(name);
    write_modules(&s);
    let module = "threader";
    let reads = if at_import == AtImport::ReadsStage {
        "True"
    } else {
        "False"
    };
    let slow = if at_import == AtImport::Slow {
        "time.sleep(3)\n"
    } else {
        ""
    };
    let scans = if at_import == AtImport::ScansEnvironment {
        "import os\nSETTINGS = {k: v for k, v in os.environ.items() if k.startswith(\"THREADER_\")}\n"
    } else {
        ""
    };
    let source = format!("import time\n{slow}{scans}READS = {reads}\n{THREAD_AT_IMPORT}");
    s.write(&format!("mods/{module}.py"), &source);
    s.write("shows.py", SHOWS_IMPORT);
    // Where the standby readied when the zygote is ready should serve `a`, `warm` waits for it.
    let until = match at_import {
        AtImport::Slow => String::new(),
        _ => format!(
            ", WARM_UNTIL_STANDBY = \"{}\"",
            s.path().join("zygote-cache").display()
        ),
    };
    let env = format!(
        "{{ PYTHONPATH = \"{}\", MODULE = \"{module}\"{until} }}",
        s.path().join("mods").display()
    );
    let preload = format!("[\"heavy\", \"{module}\"]");
    let run_dir = gpu_chain(&s, &preload, &env, "shows.py", &["a", "b", "c"]);
    (s, run_dir)
}

/// After a stage with GPUs is forked, its zygote readies a standby: the next stage with the
/// same GPUs begins as that standby, which had imported the module the zygote leaves out for
/// its thread before the stage was given to it, so the stage's own import of it costs nothing.
/// Nothing of the run is left behind.
#[test]
fn a_stage_with_gpus_begins_as_a_standby_that_imported_what_the_zygote_leaves_out() {
    let (s, run_dir) = standby_chain("zygote-standby", AtImport::Plain);
    for name in ["a", "b", "c"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        assert_eq!(start["standby"], true, "{name}: {start}");
        assert!(
            start.get("standby_passed_over").is_none(),
            "{name}: {start}"
        );
        assert_eq!(start["left_out"][0]["module"], "threader", "{start}");
        let seen = stdout_json(&run_dir, name);
        let spawned = report_stage(&read_report(&run_dir), name)["timing"]["spawned"]
            .as_f64()
            .unwrap();
        assert_eq!(
            seen["note"]["pid"], seen["pid"],
            "{name}: imported in its own process"
        );
        let imported_at = seen["note"]["at"].as_f64().unwrap();
        assert!(
            imported_at < spawned,
            "{name}: imported {:.3} s after its start",
            imported_at - spawned
        );
    }
    for pid in stage_pids(&run_dir) {
        assert!(!alive(pid), "stage process {pid} outlived the run");
    }
    // The zygote and the standby readied after the last stage (their command lines name
    // this test's zygote cache) are gone with the run.
    let cache = s.path().join("zygote-cache").display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| alive(pid) && cmdline(pid).contains(&cache))
        .map(|pid| format!("{pid}: {}", &cmdline(pid)[..80.min(cmdline(pid).len())]))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A standby whose imports read every variable of the environment to pick out their own (as
/// tqdm, imported by most frameworks, does) is still taken on: it imports without the variables
/// orchestrate sets per stage, as the zygote does, so its reads are of variables every stage
/// of the zygote shares.
#[test]
fn a_standby_whose_imports_scan_the_environment_is_taken_on() {
    let (_s, run_dir) = standby_chain("zygote-standby-scans", AtImport::ScansEnvironment);
    for name in ["a", "b", "c"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        assert_eq!(start["standby"], true, "{name}: {start}");
    }
}

/// A standby whose imports read a variable the next stage sets otherwise (here the stage's
/// name) is refused by that stage, which is forked as usual and imports the module itself.
#[test]
fn a_standby_whose_imports_read_what_the_stage_sets_otherwise_is_not_used() {
    let (_s, run_dir) = standby_chain("zygote-standby-refused", AtImport::ReadsStage);
    for name in ["a", "b", "c"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        assert!(start.get("standby").is_none(), "{name}: {start}");
        // The report says why the standby was not taken.
        let why = start["standby_passed_over"].as_str().unwrap_or_default();
        assert!(
            why.contains("refused the stage: its imports ahead read ORCHESTRATE_STAGE"),
            "{name}: {start}"
        );
        let seen = stdout_json(&run_dir, name);
        assert_eq!(seen["note"]["stage"], name, "{name}: {seen}");
        assert_eq!(seen["note"]["pid"], seen["pid"], "{seen}");
    }
}

/// A standby still importing when the next stage comes is passed over, not waited for: that
/// stage (the first forked one, `a` or `b` as the zygote's restart without the module falls)
/// is forked as usual and imports the module itself, and the standby serves a stage after it
/// once it is ready (its import takes 3 s).
#[test]
fn a_standby_still_importing_is_passed_over_not_waited_for() {
    let (_s, run_dir) = standby_chain("zygote-standby-slow", AtImport::Slow);
    let forked: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|name| stage_start(&run_dir, name)["via"] == "zygote")
        .collect();
    let first = forked.first().expect("a stage forked from the zygote");
    let start = stage_start(&run_dir, first);
    assert!(start.get("standby").is_none(), "{first}: {start}");
    let why = start["standby_passed_over"].as_str().unwrap_or_default();
    assert!(why.contains("still importing"), "{first}: {start}");
    let seen = stdout_json(&run_dir, first);
    let spawned = report_stage(&read_report(&run_dir), first)["timing"]["spawned"]
        .as_f64()
        .unwrap();
    assert!(
        seen["note"]["at"].as_f64().unwrap() > spawned,
        "{first} imported it itself: {seen}"
    );
    let later: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .skip_while(|name| name != first)
        .skip(1)
        .collect();
    assert!(
        later
            .iter()
            .any(|name| stage_start(&run_dir, name)["standby"] == true),
        "no stage after {first} began as the standby: {:?}",
        later
            .iter()
            .map(|n| stage_start(&run_dir, n))
            .collect::<Vec<_>>()
    );
}

/// Ends once a standby of the zygote's second generation says it is ready in the lineage's
/// log (in the scratch directory's `zygote-cache`), or after 30 s (the next stage's report
/// then says why it did not begin as one).
const AWAITS_NEXT_STANDBY: &str = r#"import glob, os, time
cache = os.path.join(os.path.dirname(os.environ["MODS"]), "zygote-cache")
end = time.time() + 30
def seen():
    return any("standby ready (generation 2)" in open(p).read()
               for p in glob.glob(os.path.join(cache, "*.log")))
while not seen() and time.time() < end:
    time.sleep(0.05)
time.sleep(0.3)
"#;

/// When a zygote's next generation takes over (it learned what a stage imported), the
/// standbys waiting on the old one are readied again by the new one: the stage after the
/// change begins as a standby of the new generation, which had imported the module the
/// zygote leaves out for its thread before the stage came.
#[test]
fn a_standby_follows_its_zygote_to_the_next_generation() {
    python_available();
    let s = Scratch::new("zygote-standby-generations");
    write_modules(&s);
    learning_scripts(&s);
    s.write(
        "mods/ahead.py",
        &format!("import time\nREADS = False\n{THREAD_AT_IMPORT}"),
    );
    s.write("shows.py", SHOWS_IMPORT);
    s.write("learns.py", "import learnme\n");
    s.write("awaits_standby.py", AWAITS_NEXT_STANDBY);
    let mods = s.path().join("mods").display().to_string();
    let cache = s.path().join("zygote-cache").display().to_string();
    let env = format!(
        "{{ PYTHONPATH = \"{mods}\", MODS = \"{mods}\", MODULE = \"ahead\", \
         WARM_UNTIL_STANDBY = \"{cache}\" }}"
    );
    let stage = |name: &str, after: &str, script: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\nafter = [\"{after}\"]\ngpus = 1\n\
             command = [\"python3\", \"{script}\"]\nenv = {env}\n\n"
        )
    };
    let plan = format!(
        "[run]\npreload = [\"heavy\", \"ahead\"]\n\n{}{}{}{}",
        warm_stage("warm", "gpus = 1\n", &env),
        stage("a", "warm", "learns.py"),
        stage("wait", "a", "awaits_standby.py"),
        stage("b", "wait", "shows.py"),
    );
    let run_dir = run_on_a_stand_in_gpu(&s, &plan);
    // `a` taught the lineage `learnme`: `wait` was forked from generation 1 while generation 2
    // imported, and `b` from generation 2, as the standby that generation readied.
    assert_eq!(stage_start(&run_dir, "a")["generation"], 1);
    let start = stage_start(&run_dir, "b");
    assert_eq!(start["via"], "zygote", "{start}");
    assert_eq!(start["generation"], 2, "{start}");
    assert_eq!(start["standby"], true, "{start}");
    let seen = stdout_json(&run_dir, "b");
    assert_eq!(seen["note"]["pid"], seen["pid"], "{seen}");
    let spawned = report_stage(&read_report(&run_dir), "b")["timing"]["spawned"]
        .as_f64()
        .unwrap();
    assert!(
        seen["note"]["at"].as_f64().unwrap() < spawned,
        "b imported the module after its start: {seen}"
    );
    for pid in stage_pids(&run_dir) {
        assert!(!alive(pid), "stage process {pid} outlived the run");
    }
}

/// Builds the stand-in NVML library (`tests/fixtures/fake_nvml.c`) as `libnvidia-ml.so.1`
/// in `s`'s `nvml/` directory, which it returns.
fn fake_nvml(s: &Scratch) -> std::path::PathBuf {
    let dir = s.path().join("nvml");
    std::fs::create_dir_all(&dir).unwrap();
    let source = e2e_tests::repo_root().join("tests/fixtures/fake_nvml.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-pthread", "-O1", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(built.status.success(), "{built:?}");
    dir
}

/// DeepSpeed's accelerator at import: `pynvml.nvmlInit()`, nothing asked of NVML yet.
const INITS_NVML: &str = "import os, pynvml\npynvml.nvmlInit()\nPID = os.getpid()\n";

/// DeepSpeed's accelerator detection at import: torch's device count (through NVML, under
/// the zygote's `PYTORCH_NVML_BASED_CUDA_CHECK`).
const COUNTS_GPUS: &str = "import os, torch\nN = torch.cuda.device_count()\nPID = os.getpid()\n";

/// A module that uses NVML at import: its init cannot be held back.
const USES_NVML: &str =
    "import os, pynvml\npynvml.nvmlInit()\nCOUNT = pynvml.nvmlDeviceGetCount()\nPID = os.getpid()\n";

/// A stage that imports the modules of MODULES and asks NVML for the device count.
const ASKS_NVML: &str = r#"import json, os, pynvml
modules = {m: __import__(m) for m in os.environ["MODULES"].split(",")}
count = pynvml.nvmlDeviceGetCount()
print(json.dumps({"pid": os.getpid(), "count": count,
                  "imported_in": {m: mod.PID for m, mod in modules.items()},
                  "torch_count": getattr(modules.get("countsgpus"), "N", None)}))
"#;

/// Runs warm, a, b on one stand-in GPU with the stand-in NVML library, the framework venv's
/// python (torch, pynvml) and `preload = ["heavy", MODULES…]` (`warm` ends once a standby
/// is ready, so the zygote serves `a` and `b`); returns the run directory, the
/// NVML log's lines (`what pid`) and the scratch.
fn nvml_chain(name: &str, modules: &[&str]) -> Option<(Scratch, std::path::PathBuf, Vec<String>)> {
    let python = e2e_tests::framework_python()?;
    let s = Scratch::new(name);
    write_modules(&s);
    s.write("mods/initsnvml.py", INITS_NVML);
    s.write("mods/countsgpus.py", COUNTS_GPUS);
    s.write("mods/usesnvml.py", USES_NVML);
    s.write("asks.py", ASKS_NVML);
    let nvml = fake_nvml(&s);
    let log = s.path().join("nvml.log");
    let env = format!(
        "{{ PYTHONPATH = \"{}\", LD_LIBRARY_PATH = \"{}\", FAKE_NVML_LOG = \"{}\", MODULES = \"{}\", \
         WARM_UNTIL_STANDBY = \"{}\" }}",
        s.path().join("mods").display(),
        nvml.display(),
        log.display(),
        modules.join(","),
        s.path().join("zygote-cache").display()
    );
    let preload: Vec<String> = ["heavy"]
        .iter()
        .chain(modules)
        .map(|m| format!("\"{m}\""))
        .collect();
    let mut plan = format!(
        "[run]\npreload = [{}]\n\n{}",
        preload.join(", "),
        warm_stage("warm", "gpus = 1\n", &env)
    );
    for (stage, after) in [("a", "warm"), ("b", "a")] {
        plan += &format!(
            "[[stage]]\nname = \"{stage}\"\nafter = [\"{after}\"]\ngpus = 1\n\
             command = [\"python3\", \"asks.py\"]\nenv = {env}\n\n"
        );
    }
    let plan = s.write("plan.toml", &plan);
    let run_dir = s.path().join("run");
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    let out = e2e_tests::orchestrate_with(&python)
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .env("ORCHESTRATE_ZYGOTE_CACHE", s.path().join("zygote-cache"))
        .env("ORCHESTRATE_FAKE_GPUS", "1")
        .env("ORCHESTRATE_FAKE_GPU_DIR", &holders)
        .output()
        .expect("orchestrate runs");
    ok(&out);
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    Some((s, run_dir, lines.lines().map(str::to_string).collect()))
}

/// A module that initialises NVML at import without using it (DeepSpeed's accelerator), and
/// one that asks torch for the device count (DeepSpeed's detection), are preloaded: the
/// zygote holds NVML's init back, so no NVML thread runs in it, and each forked stage
/// initialises NVML at its own first NVML call, which answers as it would have.
#[test]
fn a_module_that_initialises_nvml_at_import_is_preloaded_and_its_stage_initialises_it() {
    let Some((_s, run_dir, nvml)) = nvml_chain("zygote-nvml-held", &["initsnvml", "countsgpus"])
    else {
        return;
    };
    for name in ["a", "b"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        assert!(
            start
                .get("left_out")
                .is_none_or(|l| l.as_array().is_some_and(Vec::is_empty)),
            "{name}: {start}"
        );
        let seen = stdout_json(&run_dir, name);
        let pid = seen["pid"].as_i64().unwrap();
        for module in ["initsnvml", "countsgpus"] {
            let at = seen["imported_in"][module].as_i64().unwrap();
            assert_ne!(
                at, pid,
                "{name}: {module} imported by the stage itself: {seen}"
            );
        }
        assert_eq!(seen["count"], 1, "{seen}");
        assert_eq!(seen["torch_count"], 1, "{seen}");
        assert!(
            nvml.contains(&format!("init {pid}")),
            "{name}: its NVML init did not run in it: {nvml:?}"
        );
    }
    // Every NVML init ran in a stage; none in the zygote.
    let stages: Vec<String> = ["a", "b"]
        .iter()
        .map(|n| stdout_json(&run_dir, n)["pid"].to_string())
        .collect();
    for line in nvml.iter().filter(|l| l.starts_with("init ")) {
        assert!(
            stages.iter().any(|p| line == &format!("init {p}")),
            "an NVML init outside the stages: {line} ({nvml:?})"
        );
    }
}

/// A module that uses NVML at import (asks it for the device count) still starts NVML's
/// thread in the zygote, and is left out, named with that thread; its stages import it
/// themselves.
#[test]
fn a_module_that_uses_nvml_at_import_is_still_left_out() {
    let Some((_s, run_dir, _)) = nvml_chain("zygote-nvml-used", &["usesnvml"]) else {
        return;
    };
    let start = stage_start(&run_dir, "a");
    assert_eq!(start["via"], "zygote", "{start}");
    let left_out = start["left_out"].as_array().expect("left_out");
    assert_eq!(left_out[0]["module"], "usesnvml", "{start}");
    let seen = stdout_json(&run_dir, "a");
    assert_eq!(seen["imported_in"]["usesnvml"], seen["pid"], "{seen}");
}

mod read_ahead;

/// A stage that comes late in its zygote's imports (after an earlier stage of the chain ran
/// for most of them) waits the moment the zygote still needs, and is forked, where an exec'd
/// stage would import everything again.
#[test]
fn a_stage_that_comes_late_in_the_zygote_s_imports_waits_for_it_and_is_forked() {
    python_available();
    let s = Scratch::new("zygote-late");
    // The zygote is ready some 6 s after its start; the first stage ends 5.5 s after its own.
    s.write(
        "mods/zygote_late_import.py",
        "import time\ntime.sleep(6.0)\n",
    );
    s.write("long.py", "import time\ntime.sleep(5.5)\n");
    s.write("quick.py", "print('quick')\n");
    let plan = s.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"zygote_late_import\"]\n\n\
             [[stage]]\nname = \"first\"\ncommand = [\"python3\", \"long.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n\n\
             [[stage]]\nname = \"second\"\nafter = [\"first\"]\ncommand = [\"python3\", \"quick.py\"]\nenv = {{ PYTHONPATH = \"{m}\" }}\n",
            m = s.path().join("mods").display()
        ),
    );
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, &[]));
    let first = stage_start(&run_dir, "first");
    assert_eq!(first["via"], "exec", "{first}");
    let second = stage_start(&run_dir, "second");
    assert_eq!(
        second["via"], "zygote",
        "the late stage was not forked: {second}"
    );
}

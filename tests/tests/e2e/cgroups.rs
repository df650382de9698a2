//! Host isolation per stage: a cgroup v2 of its own where the host lets `orchestrate` make one
//! (this machine's v2 hierarchy does, without controllers: its memory, pids and cpu are on
//! cgroup v1), process groups otherwise; limits the host cannot enforce refused before anything
//! runs. The limits themselves (`oom_killed`, `pids`) need a delegated hierarchy: see
//! `bench/cgroup/h200_check.sh` and its committed results.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::{
    orchestrate, read_report, report_stage, run_plan, run_plan_with, wait_for, Scratch,
};
use std::process::Command;
use std::time::Duration;

/// `orchestrate doctor`'s line.
fn doctor(env: &[(&str, &str)]) -> String {
    let out = Command::new(orchestrate())
        .arg("doctor")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this host gives stages a cgroup each (`orchestrate doctor`); under CI it must.
fn stage_cgroups_here() -> bool {
    let line = doctor(&[]);
    let cgroups = line.contains("stages get a cgroup each");
    if std::env::var("CI").as_deref() == Ok("true") {
        // The CI machine's cgroup v2 hierarchy lets root make cgroups: this path must run.
        assert!(cgroups, "no usable cgroup v2 on the CI machine: {line}");
    }
    cgroups
}

/// `ORCHESTRATE_CGROUP_NAMESPACES=always`: a cgroup namespace per stage wherever the kernel
/// lets, where by default a stage gets one only where it confines (`nsdelegate`).
const NAMESPACES_ALWAYS: (&str, &str) = ("ORCHESTRATE_CGROUP_NAMESPACES", "always");

/// Whether stages get a cgroup namespace of their own here under `env` (`orchestrate
/// doctor`), and whether it confines them (`nsdelegate`). Under CI, as root, they must get one
/// when asked for always.
fn stage_namespaces_here(env: &[(&str, &str)]) -> (bool, bool) {
    let line = doctor(env);
    let namespaced = line.contains("each stage in a cgroup namespace of its own");
    let confining = line.contains("nsdelegate: moves out of it refused");
    // SAFETY: geteuid has no preconditions.
    if std::env::var("CI").as_deref() == Ok("true") && unsafe { libc::geteuid() } == 0 {
        if env.contains(&NAMESPACES_ALWAYS) {
            assert!(namespaced, "root gets no cgroup namespace on CI: {line}");
        }
        // By default one only where it confines.
        assert_eq!(
            namespaced,
            confining || env.contains(&NAMESPACES_ALWAYS),
            "{line}"
        );
    }
    (namespaced, confining)
}

/// `orchestrate` with `env` added to its environment.
fn orchestrate_with(env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(orchestrate());
    cmd.envs(env.iter().copied());
    cmd
}

/// Where the cgroup v2 hierarchy is mounted (its root's `cgroup.procs` is the one a stage
/// writes itself into to leave its cgroup).
fn v2_root() -> std::path::PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| left.split_whitespace().nth(4).map(Into::into))?
        })
        .expect("a cgroup v2 mount")
}

/// The `0::` path of a `/proc/<pid>/cgroup` text.
fn v2(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

/// Whether process `pid` is alive running `sleep 301` (the escapee below; a reused pid is not).
fn escapee_alive(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x00301\x00")
}

/// A stage whose setsid'd, token-less grandchild writes itself into the root cgroup's
/// `cgroup.procs` (`moved` is touched if the kernel let it), its pid in `pidfile`.
fn mover_stage(name: &str, pidfile: &std::path::Path, moved: &std::path::Path) -> String {
    format!(
        r#"[[stage]]
name = "{name}"
command = ["sh", "-c", "setsid env -i sleep 301 </dev/null >/dev/null 2>&1 & echo $! > {pid}; echo $! > {root}/cgroup.procs && touch {moved}; sleep 0.3"]
"#,
        pid = pidfile.display(),
        root = v2_root().display(),
        moved = moved.display(),
    )
}

/// The pid an escapee wrote to `pidfile`, and whether it was gone within 2 s (it is killed
/// here when it was not, so that no test leaves it behind).
fn escapee_gone(pidfile: &std::path::Path) -> (i32, bool) {
    let pid: i32 = std::fs::read_to_string(pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = wait_for(Duration::from_secs(2), || !escapee_alive(pid));
    if !gone {
        // SAFETY: killing the test's own leaked process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    (pid, gone)
}

/// Whether `stage`'s report names `pid` (running `sleep`) among its leftover processes.
fn lists_leftover(stage: &serde_json::Value, pid: i32) -> bool {
    stage["leftover_processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l == &format!("pid {pid} (sleep)"))
}

/// The stage's moved process was reported as its leftover and is gone; `moved` says whether
/// the move happened, as this host's namespaces promise. Kills the escapee if it lives.
fn mover_was_caught(stage: &serde_json::Value, pidfile: &std::path::Path, moved: &std::path::Path) {
    let (pid, gone) = escapee_gone(pidfile);
    let (_, confining) = stage_namespaces_here(&[]);
    // With nsdelegate the kernel refuses the move; without, root's write goes through.
    assert_eq!(moved.exists(), !confining, "{stage}");
    assert!(
        gone,
        "pid {pid}, which left the stage's cgroup, outlived the run"
    );
    assert!(
        lists_leftover(stage, pid),
        "pid {pid} is not among the leftovers: {stage}"
    );
}

#[test]
fn a_process_that_moves_itself_to_another_cgroup_is_still_the_stages_and_is_killed() {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new("cgroups-mover");
    let (pidfile, moved) = (scratch.path().join("pid"), scratch.path().join("moved"));
    let plan = scratch.write("plan.toml", &mover_stage("mover", &pidfile, &moved));
    let result = run_plan(&scratch, &plan, &[]);
    let stage = result.stage("mover");
    assert_eq!(stage["host"]["isolation"], "cgroup", "{stage}");
    mover_was_caught(&stage, &pidfile, &moved);
}

/// What a stage's grandchild runs to leave everything it can: the stage's cgroup (for the v2
/// root's, where the kernel lets it) and the stage's process group (for the orchestrator's own,
/// which the kernel allows only to a process of the same session: a stage led as a group in
/// the orchestrator's session). It keeps its environment, and so the stage's token.
/// Arguments: the orchestrator's group, the root's `cgroup.procs`, a file touched once it
/// joined that group, its pid file.
const JOINER: &str = r#"import os, sys
group, procs, joined, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
try:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
except OSError:
    pass
try:
    os.setpgid(0, group)
    open(joined, "w").close()
except PermissionError:
    pass
with open(pidfile, "w") as f:
    f.write(str(os.getpid()))
os.execvp("sleep", ["sleep", "301"])
"#;

#[test]
fn a_process_that_joins_the_orchestrators_own_process_group_is_still_the_stages_and_is_killed() {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new("cgroups-group-joiner");
    let path = |name: &str| scratch.path().join(name);
    let joiner = scratch.write("joiner.py", JOINER);
    // The stage's first process notes whether it shares the orchestrator's session (a stage
    // led as a group does), then double-forks the joiner so that it is re-parented to the
    // orchestrator, and ends.
    let plan = format!(
        r#"[[stage]]
name = "joiner"
command = ["sh", "-c", "[ \"$(cut -d' ' -f6 /proc/$$/stat)\" = \"$(cut -d' ' -f6 /proc/$PPID/stat)\" ] && touch {same}; (python3 {joiner} $(cut -d' ' -f5 /proc/$PPID/stat) {root}/cgroup.procs {joined} {pid} &); sleep 0.5"]
"#,
        same = path("same-session").display(),
        joiner = joiner.display(),
        root = v2_root().display(),
        joined = path("joined").display(),
        pid = path("pid").display(),
    );
    let plan = scratch.write("plan.toml", &plan);
    let result = run_plan(&scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    let stage = result.stage("joiner");
    let (pid, gone) = escapee_gone(&path("pid"));
    // In the orchestrator's session the join is allowed, and made; in a session of the
    // stage's own it is refused.
    assert_eq!(
        path("joined").exists(),
        path("same-session").exists(),
        "{stage}"
    );
    assert!(
        gone,
        "pid {pid}, which joined the orchestrator's group, outlived the run"
    );
    assert!(
        lists_leftover(&stage, pid),
        "pid {pid} is not among the leftovers: {stage}"
    );
}

/// Runs `plan` with `orchestrate` on a terminal of its own (`script` gives it one), and
/// returns what its one stage wrote to `out`: whether it could open `/dev/tty`.
fn tty_seen_by_a_stage(scratch: &Scratch, at_terminal: bool) -> String {
    let out = scratch
        .path()
        .join(if at_terminal { "tty-at" } else { "tty-off" });
    let plan = scratch.write(
        "plan.toml",
        &format!(
            r#"[[stage]]
name = "reader"
command = ["sh", "-c", "if (exec 3</dev/tty) 2>/dev/null; then echo opened; else echo refused; fi > {}"]
"#,
            out.display()
        ),
    );
    let run_dir = scratch
        .path()
        .join(if at_terminal { "run-at" } else { "run-off" });
    let command = format!(
        "{} --plan {} --run-dir {}",
        orchestrate().display(),
        plan.display(),
        run_dir.display()
    );
    let status = if at_terminal {
        Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
    } else {
        Command::new("setsid")
            .args(["-w", "sh", "-c", &command])
            .stdout(std::process::Stdio::null())
            .status()
    }
    .unwrap();
    assert!(status.success(), "{status}");
    std::fs::read_to_string(out).unwrap().trim().to_string()
}

#[test]
fn a_stage_has_no_terminal_to_open_whether_or_not_the_run_was_started_at_one() {
    let scratch = Scratch::new("cgroups-terminal");
    assert_eq!(tty_seen_by_a_stage(&scratch, true), "refused");
    assert_eq!(tty_seen_by_a_stage(&scratch, false), "refused");
}

#[test]
fn a_stage_that_ends_while_another_runs_kills_none_of_the_others_moved_processes() {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new("cgroups-mover-bystander");
    let path = |name: &str| scratch.path().join(name);
    let (pidfile, moved) = (path("pid"), path("moved"));
    // The bystander's own moved process must live through the mover's end and stop.
    let plan = format!(
        r#"[[stage]]
name = "bystander"
command = ["sh", "-c", "setsid env -i sleep 301 </dev/null >/dev/null 2>&1 & echo $! > {bpid}; echo $! > {root}/cgroup.procs; sleep 1.5; kill -0 $(cat {bpid}) && touch {alive}"]

{mover}"#,
        bpid = path("bpid").display(),
        root = v2_root().display(),
        alive = path("alive").display(),
        mover = mover_stage("mover", &pidfile, &moved),
    );
    let plan = scratch.write("plan.toml", &plan);
    let result = run_plan(&scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    assert!(
        path("alive").exists(),
        "the bystander's process was killed with the mover: {}",
        result.stderr
    );
    let report = result.report();
    for file in ["pid", "bpid"] {
        let (pid, gone) = escapee_gone(&path(file));
        assert!(gone, "pid {pid} ({file}) outlived the run");
        // Whose: the stage it carried a token of, or that was running when it was born
        // (with both running, the last of them to end claims it).
        let listed = ["bystander", "mover"]
            .iter()
            .any(|s| lists_leftover(report_stage(&report, s), pid));
        assert!(listed, "pid {pid} is no stage's leftover: {report}");
    }
}

#[test]
fn under_the_daemon_a_process_that_moves_itself_to_another_cgroup_is_killed_with_its_stage() {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new("cgroups-mover-daemon");
    let (pidfile, moved) = (scratch.path().join("pid"), scratch.path().join("moved"));
    let daemon = TestDaemon::start_in(scratch.path(), "daemon.log");
    let mut conn = daemon.connect();
    let id = conn.submit_toml(&mover_stage("mover", &pidfile, &moved), scratch.path());
    let run = conn.wait(&id);
    let dir = std::path::PathBuf::from(run["run_dir"].as_str().unwrap());
    let report = read_report(&dir);
    let stage = report_stage(&report, "mover");
    assert_eq!(stage["host"]["isolation"], "cgroup", "{stage}");
    mover_was_caught(stage, &pidfile, &moved);
}

/// Runs a stage that writes its own `/proc/self/cgroup`, then `---`, then its parent's
/// (`orchestrate`'s), with `env` added to `orchestrate`'s environment; returns the two `0::`
/// paths it read, and whether its own path joined to the hierarchy's mount point was a cgroup
/// while it ran (as a program that finds its limits that way joins them).
fn cgroup_paths_seen_by_a_stage(name: &str, env: &[(&str, &str)]) -> (String, String, bool) {
    let scratch = Scratch::new(name);
    let out = scratch.path().join("cgroup.txt");
    let mounted = scratch.path().join("mounted");
    let plan = scratch.write(
        "plan.toml",
        &format!(
            "[[stage]]
name = \"where\"
command = [\"sh\", \"-c\", \"cat /proc/self/cgroup > {0}; echo --- >> {0}; cat /proc/$PPID/cgroup >> {0}; \
             [ -e {1}$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs ] && touch {2}; true\"]\n",
            out.display(),
            v2_root().display(),
            mounted.display(),
        ),
    );
    let result = run_plan_with(orchestrate_with(env), &scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    let text = std::fs::read_to_string(&out).unwrap();
    let (own, parent) = text.split_once("---").unwrap();
    (v2(own), v2(parent), mounted.exists())
}

#[test]
fn a_stage_sees_its_cgroup_as_the_root_of_a_cgroup_namespace_of_its_own() {
    if !stage_cgroups_here() || !stage_namespaces_here(&[NAMESPACES_ALWAYS]).0 {
        return;
    }
    let (own, parent, _) = cgroup_paths_seen_by_a_stage("cgroups-namespace", &[NAMESPACES_ALWAYS]);
    assert_eq!(own, "/");
    // orchestrate (its parent) is two levels up: the run's cgroup, then the stage's.
    assert_eq!(parent, "/../..");
}

#[test]
fn where_a_namespace_would_not_confine_a_stage_sees_its_own_cgroup_where_it_is_mounted() {
    if !stage_cgroups_here() || stage_namespaces_here(&[]).0 {
        return;
    }
    let (own, parent, mounted) = cgroup_paths_seen_by_a_stage("cgroups-no-namespace", &[]);
    // Its own cgroup, two levels below orchestrate's (the run's, then the stage's), by the
    // path a program that looks for its limits joins to the mount point.
    let below = own
        .strip_prefix(parent.trim_end_matches('/'))
        .unwrap_or_else(|| panic!("{own} is not below {parent}"));
    assert_eq!(below.matches('/').count(), 2, "{own} below {parent}");
    assert!(below.starts_with("/orchestrate-"), "{own}");
    assert!(mounted, "{own} is not where the hierarchy is mounted");
}

/// Pids of processes whose command line holds `marker`.
fn with_marker(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            pids.push(pid);
        }
    }
    pids
}

/// A stage whose main process exits at once, leaving a double-forked escapee in its own
/// session with an empty environment (no token to find it by).
fn escapee_plan(scratch: &Scratch, marker: &str) -> std::path::PathBuf {
    scratch.write(
        "plan.toml",
        &format!(
            r#"[[stage]]
name = "escape"
command = ["sh", "-c", "setsid env -i /bin/sh -c 'sleep 300; : {marker}' </dev/null >/dev/null 2>&1 & sleep 0.3"]
"#
        ),
    )
}

fn escapee_is_killed_with(env: &[(&str, &str)], isolation: &str) {
    let scratch = Scratch::new(&format!("cgroups-escape-{isolation}"));
    let marker = format!("escapee-{}-{isolation}", std::process::id());
    let plan = escapee_plan(&scratch, &marker);
    let mut cmd = Command::new(orchestrate());
    cmd.envs(env.iter().copied());
    let result = run_plan_with(cmd, &scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    let stage = result.stage("escape");
    assert_eq!(stage["host"]["isolation"], isolation, "{stage}");
    let leftovers = stage["leftover_processes"].as_array().unwrap();
    assert!(!leftovers.is_empty(), "the escapee was found: {stage}");
    assert!(
        wait_for(Duration::from_secs(2), || with_marker(&marker).is_empty()),
        "escapee still alive: {:?}",
        with_marker(&marker)
    );
    if isolation == "cgroup" {
        // The run's cgroup (and every stage's under it) is gone once the run is.
        let line = result
            .stderr
            .lines()
            .find_map(|l| l.split("a cgroup per stage under ").nth(1))
            .unwrap_or_else(|| panic!("no isolation line in {}", result.stderr));
        let dir = std::path::Path::new(line.split(';').next().unwrap().trim());
        assert!(dir.starts_with("/sys/fs/cgroup"), "{}", dir.display());
        assert!(!dir.exists(), "{} was not removed", dir.display());
    }
}

#[test]
fn an_escapee_without_a_token_is_found_through_the_stage_cgroup_and_killed() {
    let cgroups = stage_cgroups_here();
    escapee_is_killed_with(&[], if cgroups { "cgroup" } else { "process_group" });
}

#[test]
fn without_cgroups_the_process_group_fallback_still_kills_the_escapee_and_says_so() {
    let env = [("ORCHESTRATE_CGROUPS", "0")];
    assert!(
        doctor(&env).contains("process groups only"),
        "{}",
        doctor(&env)
    );
    escapee_is_killed_with(&env, "process_group");
}

#[test]
fn a_limit_the_host_cannot_enforce_is_refused_with_exit_2_before_anything_runs() {
    let scratch = Scratch::new("cgroups-refused");
    let marker = scratch.path().join("ran");
    let plan = scratch.write(
        "plan.toml",
        &format!(
            "[[stage]]\nname = \"hog\"\nmemory = \"256MiB\"\npids = 64\ncommand = [\"touch\", \"{}\"]\n",
            marker.display()
        ),
    );
    // Without cgroups (or on a host whose memory controller is on cgroup v1, like this one)
    // nothing can hold the stage to 256 MiB.
    let mut envs: Vec<Vec<(&str, &str)>> = vec![vec![("ORCHESTRATE_CGROUPS", "0")]];
    if doctor(&[]).contains("memory: no") {
        envs.push(vec![]);
    }
    for env in envs {
        let out = Command::new(orchestrate())
            .arg("validate")
            .arg(&plan)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("stage `hog` sets memory = \"256MiB\", pids = 64 but")
                && stderr.contains("`memory` needs the `memory` controller")
                && stderr.contains("`pids` needs the `pids` controller"),
            "{stderr}"
        );
        let mut cmd = Command::new(orchestrate());
        cmd.envs(env.iter().copied());
        let result = run_plan_with(cmd, &scratch, &plan, &[]);
        assert_eq!(result.code, Some(2), "{}", result.stderr);
        assert!(
            result.stderr.contains("cannot enforce"),
            "{}",
            result.stderr
        );
        assert!(!marker.exists(), "the stage ran");
    }
    // The same plan without limits runs.
    let plain = scratch.write(
        "plain.toml",
        &format!(
            "[[stage]]\nname = \"hog\"\ncommand = [\"touch\", \"{}\"]\n",
            marker.display()
        ),
    );
    let result = run_plan(&scratch, &plain, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    assert!(marker.exists());
}

#[test]
fn a_worker_forked_by_the_fork_server_is_born_in_its_stage_cgroup() {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new("cgroups-fork-server");
    let plan = scratch.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\nkind = \"train\"\n[stage.params]\nsteps = 4\nbatch_size = 4\n\
         seq_len = 32\nseed = 3\nmodel = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }\n",
    );
    let result = run_plan(&scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    // The intermediate process moves itself into the stage's cgroup before forking the
    // worker; had that failed, the fork server would have refused and the worker been exec'd.
    let stderr = std::fs::read_to_string(result.run_dir.join("stages/a/stderr.log")).unwrap();
    assert!(stderr.contains("started by the fork server"), "{stderr}");
    let stage = result.stage("a");
    assert_eq!(stage["host"]["isolation"], "cgroup", "{stage}");
    assert_eq!(
        stage["leftover_processes"],
        serde_json::json!([]),
        "{stage}"
    );
}

/// Runs a built-in stage through the fork server with `env` added to `orchestrate`'s
/// environment, and returns its worker's pid and cgroup namespace (`/proc/<pid>/ns/cgroup`).
fn fork_server_worker_namespace(name: &str, env: &[(&str, &str)]) -> (i32, std::path::PathBuf) {
    let scratch = Scratch::new(name);
    let plan = scratch.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\nkind = \"train\"\n[stage.params]\nsteps = 100000\nbatch_size = 4\n\
         seq_len = 32\nseed = 3\nmodel = { d_model = 32, n_layers = 1, n_heads = 2, max_seq_len = 32 }\n",
    );
    let run_dir = scratch.path().join("run");
    let mut orch = orchestrate_with(env)
        .arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/cgroup")).ok();
    let mut seen = None;
    wait_for(Duration::from_secs(30), || {
        seen = e2e_tests::stage_pids(&run_dir)
            .first()
            .and_then(|pid| Some((*pid, ns(&pid.to_string())?)));
        seen.is_some()
    });
    // SAFETY: signalling the orchestrate this test started.
    unsafe { libc::kill(orch.id() as i32, libc::SIGTERM) };
    let _ = orch.wait();
    let seen = seen.expect("the worker started");
    let stderr = std::fs::read_to_string(run_dir.join("stages/a/stderr.log")).unwrap();
    assert!(stderr.contains("started by the fork server"), "{stderr}");
    seen
}

#[test]
fn a_worker_forked_by_the_fork_server_is_in_a_cgroup_namespace_of_its_own() {
    if !stage_cgroups_here() || !stage_namespaces_here(&[NAMESPACES_ALWAYS]).0 {
        return;
    }
    let (pid, worker_ns) =
        fork_server_worker_namespace("cgroups-fork-server-namespace", &[NAMESPACES_ALWAYS]);
    let own = std::fs::read_link("/proc/self/ns/cgroup").unwrap();
    assert_ne!(
        worker_ns, own,
        "worker {pid} shares the test's cgroup namespace"
    );
}

#[test]
fn where_a_namespace_would_not_confine_a_worker_forked_by_the_fork_server_gets_none() {
    if !stage_cgroups_here() || stage_namespaces_here(&[]).0 {
        return;
    }
    let (pid, worker_ns) = fork_server_worker_namespace("cgroups-fork-server-no-namespace", &[]);
    let own = std::fs::read_link("/proc/self/ns/cgroup").unwrap();
    assert_eq!(
        worker_ns, own,
        "worker {pid} has a cgroup namespace of its own"
    );
}

#[test]
fn a_python_stage_forked_from_the_zygote_is_born_in_its_stage_cgroup() {
    zygote_stage_is_born_in_its_stage_cgroup("cgroups-zygote", &[]);
}

#[test]
fn a_python_stage_forked_from_the_zygote_is_born_in_a_cgroup_namespace_when_asked_for_always() {
    zygote_stage_is_born_in_its_stage_cgroup("cgroups-zygote-namespace", &[NAMESPACES_ALWAYS]);
}

/// A Python stage forked from the zygote, `orchestrate_env` added to `orchestrate`'s
/// environment, is born in its stage's cgroup, in a cgroup namespace rooted there exactly when
/// `orchestrate doctor` says stages get one under `orchestrate_env`.
fn zygote_stage_is_born_in_its_stage_cgroup(name: &str, orchestrate_env: &[(&str, &str)]) {
    if !stage_cgroups_here() {
        return;
    }
    let scratch = Scratch::new(name);
    scratch.write(
        "where.py",
        "import os, sys\nout = os.environ['ORCHESTRATE_OUTPUT_DIR']\n\
         open(os.path.join(out, 'cgroup.txt'), 'w').write(open('/proc/self/cgroup').read())\n\
         open(os.path.join(out, 'parent.txt'), 'w').write(open(f'/proc/{os.getppid()}/cgroup').read())\n",
    );
    // The zygote's import of `zmark` leaves its pid in `zmark.pid`; `warm`, exec'd while the
    // zygote starts (the run does not wait for it), ends once it is there, so `a` is forked.
    scratch.write(
        "zmark.py",
        "import os\nopen(os.path.join(os.path.dirname(__file__), 'zmark.pid'), 'w').write(str(os.getpid()))\n",
    );
    scratch.write(
        "warm.py",
        "import os, time\nmark = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'zmark.pid')\n\
         end = time.time() + 60\nwhile not os.path.exists(mark) and time.time() < end:\n    time.sleep(0.05)\n\
         time.sleep(0.3)\n",
    );
    let env = format!(
        "env = {{ PYTHONPATH = \"{}\" }}\n",
        scratch.path().display()
    );
    let plan = scratch.write(
        "plan.toml",
        &format!(
            "[run]\npreload = [\"json\", \"zmark\"]\n\
             [[stage]]\nname = \"warm\"\ncommand = [\"python3\", \"warm.py\"]\n{env}\
             [[stage]]\nname = \"a\"\nafter = [\"warm\"]\ncommand = [\"python3\", \"where.py\"]\n{env}"
        ),
    );
    let result = run_plan_with(orchestrate_with(orchestrate_env), &scratch, &plan, &[]);
    assert_eq!(result.code, Some(0), "{}", result.stderr);
    let stage = result.stage("a");
    assert_eq!(stage["start"]["via"], "zygote", "{stage}");
    assert_eq!(stage["host"]["isolation"], "cgroup", "{stage}");
    // Born in the stage's own cgroup (the zygote's intermediate moved itself there before
    // forking), not in the zygote's or the test's.
    let cgroup =
        std::fs::read_to_string(result.run_dir.join("stages/a/output/cgroup.txt")).unwrap();
    if stage_namespaces_here(orchestrate_env).0 {
        // In a cgroup namespace rooted at the stage's cgroup, two levels below orchestrate's
        // (the run's, then the stage's): the intermediate unshared once it had moved there.
        assert_eq!(v2(&cgroup), "/", "{cgroup}");
        let parent = v2(&std::fs::read_to_string(
            result.run_dir.join("stages/a/output/parent.txt"),
        )
        .unwrap());
        assert_eq!(parent, "/../..", "{cgroup}");
        return;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_ne!(v2(&cgroup), v2(&own), "{cgroup}");
    // A stage's cgroup is `N-<stage>`, or `stage-N` where idle ones are reused.
    let leaf = v2(&cgroup)
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        leaf.ends_with("-a") || leaf.starts_with("stage-"),
        "{cgroup}"
    );
}

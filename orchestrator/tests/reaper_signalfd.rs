//! The reaper as the orchestrator runs it: SIGCHLD blocked in every thread, every child's end
//! learned from one signalfd (no pidfd per child).

use orchestrator::process::reaper::{block_child_signals, ExitStatus, Reaper};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// The one test here, as listed to a test runner.
const NAME: &str = "signalfd_reaps_every_child_at_once";

fn main() {
    // The libtest command line, as far as test runners use it: `--list` (nextest lists
    // `name: test` lines first), then a run of all tests or of the ones a filter names.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("{NAME}: test");
        }
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| NAME.contains(f.as_str())) {
        return;
    }
    block_child_signals();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let reaper = Reaper::start().expect("a child subreaper");
        assert!(!reaper.wants_pidfds(), "ends come from the signalfd");
        let null = std::fs::File::open("/dev/null").unwrap();
        // Children that end at the same instant: their SIGCHLDs merge into one, and every
        // status must still reach its waiter, at once (not at the reaper's periodic look,
        // a second later).
        let started = Instant::now();
        let mut waits = Vec::new();
        for code in 0..24 {
            let spawned = sh(&format!("sleep 0.3; exit {code}"), &null, &reaper);
            assert!(spawned.pidfd.is_none(), "no pidfd asked for, none made");
            waits.push((code, spawned.pid, reaper.watch(spawned.pid)));
        }
        for (code, pid, wait) in waits {
            let reaped = tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .expect("the waiter was woken")
                .expect("reaped");
            assert_eq!(reaped.status, ExitStatus::Code(code), "pid {pid}");
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(900),
            "statuses came only with the periodic look ({took:?}): the signalfd woke nobody"
        );

        // A child of a child, orphaned and re-parented here (a subreaper), is reaped too.
        let scratch = e2e_tests::Scratch::new("reaper-signalfd");
        let out = scratch.join("out");
        let file = std::fs::File::create(&out).unwrap();
        let spawned = sh("sleep 0.2 & echo $!", &file, &reaper);
        let first = reaper.watch(spawned.pid).await.expect("reaped");
        assert_eq!(first.status, ExitStatus::Code(0));
        let orphan: i32 = std::fs::read_to_string(&out)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // SAFETY: signal 0 only checks whether the process exists (a zombie does).
        while unsafe { libc::kill(orphan, 0) } == 0 {
            assert!(Instant::now() < deadline, "orphan {orphan} never reaped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    println!("test {NAME} ... ok");
}

/// Starts `sh -c script` as a stage is started, its stdout to `stdout`.
fn sh(
    script: &str,
    stdout: &std::fs::File,
    reaper: &Reaper,
) -> orchestrator::process::spawn::Spawned {
    let argv = ["sh", "-c", script].map(String::from);
    let null = std::fs::File::open("/dev/null").unwrap();
    orchestrator::process::spawn::spawn(&orchestrator::process::spawn::Request {
        argv: &argv,
        env: &[("PATH", "/usr/bin:/bin")],
        env_base: None,
        cwd: std::path::Path::new("/"),
        stdin: null.as_fd(),
        stdout: stdout.as_fd(),
        stderr: null.as_fd(),
        pidfd: reaper.wants_pidfds(),
        cgroup_procs: None,
        cgroup_dir: None,
        cgroup_namespace: false,
        leads: orchestrator::process::spawn::Leads::Session,
    })
    .unwrap()
}

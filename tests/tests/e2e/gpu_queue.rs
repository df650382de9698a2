//! The host's GPU queue (issue 47, item 1): backfill without starvation, on a daemon with two
//! stand-in GPUs. A 2-GPU run waiting on a GPU held by another process never keeps the 1-GPU
//! runs submitted after it from starting on the free GPU; once the held GPU is free, the
//! waiting run reserves both (a later 1-GPU run waits, saying for whom), and it starts within a
//! second of both being free. Each waiting stage's reason is in `runs` and `/metrics`.

use e2e_tests::daemon::TestDaemon;
use e2e_tests::http::{self, free_port};
use e2e_tests::{orchestrate, wait_for, Scratch};
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A plan of one stage `name` on `gpus` GPUs that records its start and end (Unix time and
/// the GPUs it was given) in `record`, sleeping `secs` between.
fn plan(name: &str, gpus: u32, record: &Path, secs: &str) -> String {
    format!(
        "[[stage]]\nname = \"{name}\"\ngpus = {gpus}\ncommand = [\"sh\", \"-c\", \"echo start $(date +%s.%N) $ORCHESTRATE_GPU_UUIDS >> {r}; sleep {secs}; echo end $(date +%s.%N) $ORCHESTRATE_GPU_UUIDS >> {r}\"]\n",
        r = record.display()
    )
}

/// The (time, GPUs) of the `what` line ("start" or "end") of a record, once written.
fn at(record: &Path, what: &str) -> Option<(f64, String)> {
    let text = std::fs::read_to_string(record).ok()?;
    let line = text.lines().find(|l| l.starts_with(what))?;
    let mut parts = line.split_whitespace().skip(1);
    Some((parts.next()?.parse().ok()?, parts.next()?.to_string()))
}

/// A stand-in for another user's process on the GPU, killed when dropped.
struct Stranger(std::process::Child);

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn later_small_runs_backfill_the_free_gpu_and_the_waiting_big_run_gets_both_within_a_second() {
    let s = Scratch::new("gpu-queue-backfill");
    let holders = s.path().join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    let stranger = Stranger(Command::new("sleep").arg("120").spawn().unwrap());
    let held = holders.join("GPU-fake-0");
    std::fs::write(&held, format!("{} sleep {}\n", stranger.0.id(), 4u64 << 30)).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let web = format!("127.0.0.1:{}", free_port());
    let d = TestDaemon::start_in_with(
        s.path(),
        e2e_tests::daemon::DEFAULT_IDLE_TIMEOUT,
        &["--http", &web, "--metrics-addr", &metrics],
        &[
            ("ORCHESTRATE_FAKE_GPUS", "2"),
            ("ORCHESTRATE_FAKE_GPU_DIR", holders.to_str().unwrap()),
        ],
    );
    let mut c = d.connect();
    let big_rec = s.path().join("big.txt");
    let big = c.submit_toml(&plan("big", 2, &big_rec, "0.5"), s.path());
    let status = |c: &mut e2e_tests::daemon::Conn, id: &str| {
        c.call(json!({"v": 1, "type": "status", "id": id}))["runs"][0].clone()
    };
    let holder = format!("pid {} (sleep)", stranger.0.id());
    assert!(
        wait_for(Duration::from_secs(10), || status(&mut c, &big)["waiting"]
            .to_string()
            .contains(&holder)),
        "the big run waits, naming the holder: {}",
        status(&mut c, &big)
    );

    // 1-GPU runs submitted after it start on the free GPU while it waits.
    let small1_rec = s.path().join("small1.txt");
    let small1 = c.submit_toml(&plan("small", 1, &small1_rec, "0.3"), s.path());
    assert_eq!(c.wait(&small1)["state"], "succeeded");
    let small2_rec = s.path().join("small2.txt");
    let small2 = c.submit_toml(&plan("small", 1, &small2_rec, "3"), s.path());
    assert!(wait_for(Duration::from_secs(10), || at(
        &small2_rec,
        "start"
    )
    .is_some()));
    assert_eq!(at(&small1_rec, "start").unwrap().1, "GPU-fake-1");
    assert_eq!(at(&small2_rec, "start").unwrap().1, "GPU-fake-1");
    assert!(at(&big_rec, "start").is_none(), "big cannot have started");

    // The holder goes while small2 holds GPU 1: big reserves both GPUs, and a 1-GPU run
    // submitted now waits for it instead of taking GPU 0.
    std::fs::write(&held, "").unwrap();
    drop(stranger);
    let small3_rec = s.path().join("small3.txt");
    let small3 = c.submit_toml(&plan("small", 1, &small3_rec, "0.1"), s.path());
    let reserved = format!("GPU 0 reserved for run {big}, stage `big`");
    assert!(
        wait_for(Duration::from_secs(10), || status(&mut c, &small3)
            ["waiting"]
            .to_string()
            .contains(&reserved)),
        "small3 waits for the reservation: {}",
        status(&mut c, &small3)
    );
    // `runs` and `/metrics` say so too.
    let runs = Command::new(orchestrate())
        .args(["runs", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let runs_text = String::from_utf8_lossy(&runs.stdout);
    assert!(
        runs_text
            .lines()
            .any(|l| l.starts_with(&small3) && l.contains(&reserved)),
        "{runs_text}"
    );
    let scraped = http::get(&metrics, "/metrics", &[]).text();
    assert!(
        scraped.contains("orchestrate_gpu_reserved{gpu=\"GPU-fake-0\"} 1")
            && scraped.contains("orchestrate_stages_waiting_for_gpus{reason=\"reserved\"} 1"),
        "{scraped}"
    );

    // Both GPUs free once small2 ends: big starts within a second, then small3 runs.
    assert_eq!(c.wait(&big)["state"], "succeeded");
    assert_eq!(c.wait(&small2)["state"], "succeeded");
    assert_eq!(c.wait(&small3)["state"], "succeeded");
    let (small2_end, _) = at(&small2_rec, "end").unwrap();
    let (big_start, big_gpus) = at(&big_rec, "start").unwrap();
    assert_eq!(big_gpus, "GPU-fake-0,GPU-fake-1");
    assert!(
        big_start >= small2_end && big_start - small2_end < 1.0,
        "big started {:.3} s after both GPUs were free",
        big_start - small2_end
    );
    let (small3_start, _) = at(&small3_rec, "start").unwrap();
    assert!(
        small3_start >= big_start,
        "small3 did not jump the reservation"
    );
}

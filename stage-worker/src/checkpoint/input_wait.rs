//! Waiting for an input checkpoint that its upstream stage may still be writing.
//!
//! A stage started early (its upstream released its GPU and persists its checkpoint while this
//! one starts up; see [`StageSpec::inputs_being_written`]) reads such an input only once the
//! upstream's `manifest.json` is present. The upstream writes every file in place whole first
//! and the manifest last (itself put in place whole), so a present manifest lists complete
//! files; the reader then verifies sizes and checksums as for any input (from the page cache:
//! it does not wait for the upstream's fsyncs).
//!
//! Promise of [`await_input`]: it returns `Ok` at once for a directory not being written, and
//! otherwise only once the manifest is there; it gives up with a failure when the spec's wait
//! limit has passed, and with an interrupted failure on SIGTERM or SIGINT. The orchestrator
//! stops the stage if the upstream fails, so it never waits for a checkpoint that cannot come.

use crate::failure::{Failure, StageResult};
use protocol::checkpoint::MANIFEST_FILE;
use protocol::worker::StageSpec;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often the manifest is looked for: a `stat` each time, so the wait costs nothing while
/// it adds at most this much to the stage's start.
const POLL: Duration = Duration::from_millis(5);

/// Whether `dir` is one of the spec's inputs that may still be being written.
pub fn pending(spec: &StageSpec, dir: &Path) -> bool {
    spec.inputs_being_written.iter().any(|d| d == dir)
}

/// Waits until the checkpoint in `dir` is complete, if `spec` says it may still be being
/// written; how long it waited (zero when it did not).
pub fn await_input(spec: &StageSpec, dir: &Path) -> StageResult<Duration> {
    await_input_polling(spec, dir, || {})
}

/// [`await_input`], calling `each_poll` just before each look for the manifest (so at least
/// once when `spec` says the input may still be being written, never otherwise): the caller
/// can start on a file of the checkpoint that is already in place.
pub fn await_input_polling(
    spec: &StageSpec,
    dir: &Path,
    each_poll: impl FnMut(),
) -> StageResult<Duration> {
    if !pending(spec, dir) {
        return Ok(Duration::ZERO);
    }
    let limit = spec
        .input_wait_limit_s
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    wait_for(
        &dir.join(MANIFEST_FILE),
        limit,
        crate::boot::signals::stop_requested,
        each_poll,
    )
}

/// Polls for `manifest` until it is a file, `limit` passes, or `stopped` says so.
fn wait_for(
    manifest: &Path,
    limit: Option<Duration>,
    stopped: impl Fn() -> bool,
    mut each_poll: impl FnMut(),
) -> StageResult<Duration> {
    let started = Instant::now();
    let mut said = false;
    loop {
        each_poll();
        if manifest.is_file() {
            let waited = started.elapsed();
            if said {
                crate::log!(
                    "{} is there after {:.3} s",
                    manifest.display(),
                    waited.as_secs_f64()
                );
            }
            return Ok(waited);
        }
        if stopped() {
            return Err(Failure::interrupted(format!(
                "stopped by a signal while waiting for {} (its stage was still writing it)",
                manifest.display()
            )));
        }
        if let Some(limit) = limit.filter(|&l| started.elapsed() >= l) {
            return Err(Failure::other(format!(
                "{} did not appear within {:.1} s (the stage's timeout) although its stage had released its GPU to write it",
                manifest.display(),
                limit.as_secs_f64()
            )));
        }
        if !said {
            crate::log!(
                "waiting for {} (its stage is still writing the checkpoint)",
                manifest.display()
            );
            said = true;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::FailureKind;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn returns_once_the_manifest_is_put_in_place_and_not_before() {
        let dir = crate::testutil::scratch_dir("input-wait");
        let manifest = dir.join(MANIFEST_FILE);
        let writer = {
            let dir = dir.to_path_buf();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(150));
                crate::checkpoint::fsio::write_atomic(&dir, MANIFEST_FILE, b"{}").unwrap();
                Instant::now()
            })
        };
        let waited = wait_for(&manifest, Some(Duration::from_secs(10)), || false, || {}).unwrap();
        let written_at = writer.join().unwrap();
        assert!(manifest.is_file());
        assert!(waited >= Duration::from_millis(140), "{waited:?}");
        assert!(
            written_at.elapsed() < Duration::from_millis(100),
            "returned well after the manifest appeared"
        );
    }

    #[test]
    fn gives_up_at_the_limit_and_on_a_stop() {
        let dir = crate::testutil::scratch_dir("input-wait-limit");
        let manifest = dir.join(MANIFEST_FILE);
        let t = Instant::now();
        let err =
            wait_for(&manifest, Some(Duration::from_millis(60)), || false, || {}).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(60));
        assert_eq!(err.kind, FailureKind::Other, "{}", err.message);
        assert!(err.message.contains("did not appear"), "{}", err.message);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            flag.store(true, Ordering::SeqCst);
        });
        let err = wait_for(&manifest, None, || stop.load(Ordering::SeqCst), || {}).unwrap_err();
        assert_eq!(err.kind, FailureKind::Interrupted, "{}", err.message);
    }

    #[test]
    fn an_input_not_being_written_is_not_waited_for() {
        let mut spec: StageSpec = serde_json::from_str(
            r#"{"v":1,"stage":"s","kind":"train","params":{},"output_dir":"/o","inputs":{},"init":"/up","device":"cpu","attempt":1}"#,
        )
        .unwrap();
        assert_eq!(
            await_input(&spec, Path::new("/up")).unwrap(),
            Duration::ZERO
        );
        spec.inputs_being_written.push("/up".into());
        spec.input_wait_limit_s = Some(0.0);
        assert!(pending(&spec, Path::new("/up")));
        assert!(await_input(&spec, Path::new("/up")).is_err());
    }
}

//! Helpers for unit tests.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty directory under the system temp dir, unique to this process and call.
pub fn scratch_dir(label: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!(
        "stage-worker-test-{}-{label}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Limits libtorch to one CPU thread: tests already run in parallel, and oversubscribed
/// OpenMP threads slow down badly on a small or busy machine.
pub fn one_torch_thread() {
    tch::set_num_threads(1);
}

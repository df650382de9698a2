//! Helpers of the unit tests.

use std::path::PathBuf;

/// A fresh, empty directory of its own under the system's temporary directory, named after
/// `name`, this process and a counter (tests run in parallel threads).
pub(crate) fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

//! Helpers for unit tests.

/// A fresh, empty directory of the test's own (under `target/e2e-scratch`), unique to this
/// process and call; removed when dropped unless the test failed.
pub fn scratch_dir(label: &str) -> e2e_tests::Scratch {
    e2e_tests::Scratch::new(&format!("stage-worker-{label}"))
}

/// Limits libtorch to one CPU thread: tests already run in parallel, and oversubscribed
/// OpenMP threads slow down badly on a small or busy machine.
pub fn one_torch_thread() {
    tch::set_num_threads(1);
}

//! The worker's own CUDA kernels (the embedding, the cross-entropy and the AdamW step of
//! `csrc/kernels.cu`) run on the host, one host thread per GPU thread, against reference loops
//! (`csrc/emulate/run.sh`): their arithmetic is checked on every CI run, which has no GPU (a
//! wrong AdamW denominator, for one, fails it). The emulated optimizer step's norm stays under
//! the clipping threshold; `stage-worker check-kernels` checks clipped steps, and every kernel
//! against libtorch's, on a GPU.

use std::process::Command;

#[test]
fn the_fused_kernels_compute_on_the_host_what_the_reference_loops_do() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/csrc/emulate/run.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l == "ALL OK"), "{stdout}\n{stderr}");
}

//! A trace of a few training steps from libtorch's own profiler, to see where a step's time
//! goes (operators on the CPU; kernels and copies on the GPU).
//!
//! `STAGE_WORKER_PROFILE=PATH` makes a train stage record `STAGE_WORKER_PROFILE_STEPS` steps
//! (default 3) after skipping `STAGE_WORKER_PROFILE_SKIP` (default 2) of its first steps, and
//! save them to `PATH` in the Chrome trace format (the one `torch.profiler` exports, so the
//! same tools read both). The device is synchronised before the trace is saved, so the last
//! step's kernels are in it. Profiling slows the recorded steps; the stage's reported
//! throughput is not a figure to quote when it is on.

use crate::failure::{Failure, StageResult};
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use tch::Device;

extern "C" {
    /// `csrc/profiler.cpp`: enables the Kineto profiler (CPU, and CUDA when asked).
    fn stage_worker_profiler_start(cuda: bool, err: *mut c_char, err_len: usize) -> i32;
    /// `csrc/profiler.cpp`: disables it and saves the trace at `path`.
    fn stage_worker_profiler_stop(path: *const c_char, err: *mut c_char, err_len: usize) -> i32;
}

/// Which steps to record, and where the trace goes.
pub struct StepProfile {
    path: PathBuf,
    /// The first recorded step.
    start: u64,
    /// The last recorded step.
    last: u64,
    device: Device,
    recording: bool,
}

impl StepProfile {
    /// The profile the environment asks for in a loop whose first step is `first`; `None`
    /// when `STAGE_WORKER_PROFILE` is unset or empty. A count that does not parse is an error
    /// that names the variable.
    pub fn from_env(first: u64, device: Device) -> StageResult<Option<StepProfile>> {
        let Some(path) = std::env::var_os("STAGE_WORKER_PROFILE").filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let count = |name: &str, default: u64| -> StageResult<u64> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => v.trim().parse().map_err(|_| {
                    Failure::bad_input(format!("{name} must be a whole number of steps, got {v:?}"))
                }),
            }
        };
        let skip = count("STAGE_WORKER_PROFILE_SKIP", 2)?;
        let steps = count("STAGE_WORKER_PROFILE_STEPS", 3)?;
        Ok(Some(StepProfile::new(
            PathBuf::from(path),
            first + skip,
            steps,
            device,
        )))
    }

    /// Records `steps` steps (at least one) from step `start` into `path`.
    pub fn new(path: PathBuf, start: u64, steps: u64, device: Device) -> StepProfile {
        StepProfile {
            path,
            start,
            last: start + steps.max(1) - 1,
            device,
            recording: false,
        }
    }

    /// Call before step `step` runs: starts recording at the first recorded step.
    pub fn before_step(&mut self, step: u64) -> StageResult<()> {
        if step != self.start || self.recording {
            return Ok(());
        }
        let mut err = [0 as c_char; 512];
        // SAFETY: `err` is a writable buffer of the length passed; the call takes no other
        // pointers.
        let rc = unsafe {
            stage_worker_profiler_start(self.device.is_cuda(), err.as_mut_ptr(), err.len())
        };
        if rc != 0 {
            return Err(Failure::other(format!(
                "cannot start the profiler: {}",
                message(&err)
            )));
        }
        self.recording = true;
        crate::log!(
            "profiling steps {}..={} into {}",
            self.start,
            self.last,
            self.path.display()
        );
        Ok(())
    }

    /// Call after step `step` (its optimizer update queued): after the last recorded step,
    /// or when the loop ends early (`ending`), waits for the device and saves the trace.
    pub fn after_step(&mut self, step: u64, ending: bool) -> StageResult<()> {
        if !self.recording || (step < self.last && !ending) {
            return Ok(());
        }
        self.recording = false;
        if let Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
        let path = CString::new(self.path.to_string_lossy().as_bytes())
            .map_err(|_| Failure::bad_input("STAGE_WORKER_PROFILE holds a NUL byte"))?;
        let mut err = [0 as c_char; 512];
        // SAFETY: `path` is NUL-terminated and outlives the call; `err` is a writable buffer
        // of the length passed.
        let rc = unsafe { stage_worker_profiler_stop(path.as_ptr(), err.as_mut_ptr(), err.len()) };
        if rc != 0 {
            return Err(Failure::other(format!(
                "cannot save the profile to {}: {}",
                self.path.display(),
                message(&err)
            )));
        }
        crate::log!(
            "profile of steps {}..={step} saved to {}",
            self.start,
            self.path.display()
        );
        Ok(())
    }
}

fn message(err: &[c_char]) -> String {
    let bytes: Vec<u8> = err
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn the_recorded_steps_and_only_those_are_in_the_saved_trace() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("profile");
        let path = dir.join("trace.json");
        let mut profile = StepProfile::new(path.clone(), 2, 2, Device::Cpu);
        let a = Tensor::ones([16, 16], (Kind::Float, Device::Cpu));
        for step in 1..=4u64 {
            profile.before_step(step).unwrap();
            // One kind of operator per step, so the trace shows which steps it holds.
            let _ = match step {
                1 => a.sin(),
                2 => a.matmul(&a),
                3 => a.cumsum(0, Kind::Float),
                _ => a.cos(),
            };
            profile.after_step(step, step == 4).unwrap();
            assert_eq!(path.exists(), step >= 3, "after step {step}");
        }
        let trace: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let names: Vec<&str> = trace["traceEvents"]
            .as_array()
            .expect("a Chrome trace")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        for recorded in ["aten::matmul", "aten::cumsum"] {
            assert!(
                names.contains(&recorded),
                "{recorded} missing from {names:?}"
            );
        }
        for skipped in ["aten::sin", "aten::cos"] {
            assert!(!names.contains(&skipped), "{skipped} was recorded");
        }
    }
}

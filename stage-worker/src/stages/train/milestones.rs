//! The points a training stage reached, as metrics. Carried through the stage's phases as a
//! value: each phase marks its own, and the device reports its moments as return values
//! ([`crate::device::Compute::driver_ready_at`], [`crate::device::Released`]).

use crate::device::Released;
use std::collections::BTreeMap;
use std::time::Instant;

/// When the stage reached each point, in Unix seconds, as metrics named `t_*`:
/// `t_worker_start` (the process, or the fork server's child, began), `t_cuda_init` (the CUDA
/// driver initialised, no context yet), `t_device_ready` (first device work done), `t_input_complete` (with `input_wait_s`: an init checkpoint still being
/// written when the stage started early was complete; `init_read_early` 1 when its weights
/// were read before that), `t_init_read` (the init checkpoint's bytes in memory, on the thread
/// that reads them), `t_inputs_read` (that thread joined, after the device is ready),
/// `t_model_built` (the model built and loaded; the warm-up may still run),
/// `t_model_ready` (the warm-up done too),
/// `t_first_step`, `t_last_step` (the device idle after the last step), `t_device_released`
/// (the final checkpoint's data all copied to the host and the CUDA context destroyed, when
/// that was done before the files were durable), `t_checkpoint_durable` (every file fsynced
/// and in place).
pub struct Milestones(BTreeMap<String, f64>);

impl Milestones {
    /// `t_worker_start` alone: when the log's clock started (the process, or the fork
    /// server's child, began).
    pub fn new() -> Self {
        Milestones(BTreeMap::from([(
            "t_worker_start".to_string(),
            crate::log::started_unix(),
        )]))
    }

    /// `name` is now.
    pub fn mark(&mut self, name: &str) {
        self.set(name, crate::log::unix_now());
    }

    /// `name` at `unix` (Unix seconds), or any other figure that goes with the milestones.
    pub fn set(&mut self, name: &str, unix: f64) {
        self.0.insert(name.into(), unix);
    }

    /// `name` at `when`.
    pub fn at(&mut self, name: &str, when: Instant) {
        let ago = when.elapsed().as_secs_f64();
        self.set(name, crate::log::unix_now() - ago);
    }

    /// `t_device_released` and `t_driver_closed`, from what the release did.
    pub fn released(&mut self, released: &Released) {
        self.set("t_device_released", released.at);
        if let Some(at) = released.driver_closed_at {
            self.set("t_driver_closed", at);
        }
    }

    /// The milestones as metrics.
    pub fn into_metrics(self) -> BTreeMap<String, f64> {
        self.0
    }
}

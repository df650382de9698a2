//! `orchestrate`: runs a training pipeline stage by stage, every stage in a fresh process tree,
//! hands checkpoints downstream, and verifies that each stage's GPU memory came back.
//!
//! The binary (`src/bin/orchestrate/`) is a thin shell over this library. The modules stand on
//! floors; a module imports only from floors below its own (or beside it, where two share one):
//!
//! 1. the binary: the command line, which reads the `ORCHESTRATE_*` switches once ([`settings`])
//!    and starts a [`host`] and one run, or the [`daemon`];
//! 2. [`web`]: the daemon's HTTP view, started beside the daemon by the binary;
//! 3. [`daemon`] serves plans over a Unix socket, many runs on one host (its client is in
//!    [`daemon::client`]);
//! 4. [`run`] schedules one plan's stages and decides what a resumed run keeps; where they run
//!    (here, or as Slurm job steps) is its `run::placement`, the one part of it that knows Slurm;
//! 5. [`attempt`] prepares, starts and supervises one attempt of a stage to its verdict;
//!    [`host`] is what exists once per process (reaper, guard, GPUs, CPU budget, event
//!    sockets, the Slurm allocation, the fork servers and zygotes), shared by every run;
//! 6. [`report`] makes a run readable (console, `report.json`, results) from what the run gives
//!    it (its stages' records, kept from the run's events by `report::stages`, where they ran
//!    through `report::placed`); [`slurm`] makes a run a good citizen of a Slurm allocation (the job,
//!    srun steps, requeue); [`tracking`] logs a finished run to MLflow;
//! 7. [`plan`] loads and validates plans and fingerprints their stages; [`gpu`] is the NVML
//!    inventory and the reclaim verdict; [`events`] carries a run's facts to its sinks
//!    (console, journal, the daemon's feed);
//! 8. [`process`] owns processes: spawn (exec, fork server or zygote), signal, reap, find every
//!    member; [`store`] makes a run durable (run directory, journal, checksums);
//! 9. the `protocol` crate: the formats shared with workers, the daemon's clients and reports.
//!
//! [`settings`], [`exit`], [`table`] and [`timefmt`] are plain helpers every floor may use;
//! `fasthash` is the cheap hasher of the run loop's own tables;
//! `error` gathers the errors of every floor into the one the binary shows. No module reaches
//! up.

pub mod attempt;
pub mod daemon;
pub(crate) mod error;
pub mod events;
pub mod exit;
pub(crate) mod fasthash;
pub mod gpu;
pub mod host;
pub mod plan;
pub mod process;
pub mod report;
pub mod run;
pub mod settings;
pub mod slurm;
pub mod store;
pub mod table;
#[cfg(test)]
mod testutil;
pub mod timefmt;
pub mod tracking;
pub mod web;

//! `orchestrate`: runs a training pipeline stage by stage, every stage in a fresh process tree,
//! hands checkpoints downstream, and verifies that each stage's GPU memory came back.
//!
//! The binary (`src/bin/orchestrate/`) is a thin shell over this library. The layers, from the top:
//! - [`daemon`] serves plans over a Unix socket, many runs on one host (its client is in
//!   [`daemon::client`]); [`slurm`] makes a run a good citizen of a Slurm allocation;
//! - [`run`] schedules one plan's stages on the [`host`] (what exists once per process: reaper,
//!   guard, GPUs, CPU budget, event sockets), shared by every run;
//! - [`attempt`] prepares, starts and supervises one attempt of a stage to its verdict;
//! - [`process`] owns processes: spawn (exec or fork server), signal, reap, find every member;
//! - [`gpu`] is the NVML inventory and the reclaim verdict;
//! - [`store`] makes a run durable (run directory, journal, resume), [`report`] makes it
//!   readable (console, `report.json`, results);
//! - [`plan`] loads and validates plans;
//! - [`table`] and [`timefmt`] are plain-text helpers every layer may use.

pub mod attempt;
pub mod daemon;
pub(crate) mod error;
pub mod exit;
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
pub mod web;

//! `orchestrate`: runs a training pipeline stage by stage, every stage in a fresh process tree,
//! hands checkpoints downstream, and verifies that each stage's GPU memory came back.
//!
//! The binary (`src/main.rs`) is a thin shell over this library:
//! - [`plan`] loads and validates plans;
//! - [`runner`] schedules stages and drives each through [`stage`];
//! - [`supervisor`], [`forkserver`], [`reaper`] and [`proctree`] own processes: spawn (exec or
//!   fork server), signal, reap, find every descendant;
//! - [`channel`] receives the JSON-lines events stages send;
//! - [`gpu`] is the NVML inventory and the reclaim verdict;
//! - [`journal`], [`rundir`] and [`report`] make a run durable and readable;
//! - [`console`] shows progress.

pub mod channel;
pub mod checksum;
pub mod console;
pub mod contract;
pub mod echo;
pub mod exit;
pub mod fingerprint;
pub mod forkserver;
pub mod gpu;
pub mod guard;
pub mod journal;
pub mod plan;
pub mod proctree;
pub mod reaper;
pub mod report;
pub mod results;
pub mod resume;
pub mod rundir;
pub mod runner;
pub mod stage;
pub mod supervisor;
pub mod timefmt;

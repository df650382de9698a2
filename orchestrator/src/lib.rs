//! `orchestrate`: runs a training pipeline stage by stage, every stage in a fresh process tree,
//! hands checkpoints downstream, and verifies that each stage's GPU memory came back.
//!
//! The binary (`src/main.rs`) is a thin shell over this library:
//! - [`plan`] loads and validates plans;
//! - [`host`] is what exists once per process (reaper, guard, GPUs, CPU budget, the event
//!   sockets' directory in [`sockets`]), shared by every run; [`runner`] schedules one plan's
//!   stages on it, [`attempt`] prepares each attempt and [`stage`] drives it;
//! - [`supervisor`], [`forkserver`], [`reaper`] and [`proctree`] own processes: spawn (exec or
//!   fork server), signal, reap, find every descendant;
//! - [`channel`] receives the JSON-lines events stages send;
//! - [`gpu`] is the NVML inventory and the reclaim verdict;
//! - [`journal`], [`rundir`] and [`report`] make a run durable and readable;
//! - [`console`] shows progress and is the tap of a run's event stream;
//! - [`daemon`] serves plans over a Unix socket, many runs on one host; [`client`] talks to it.
//! - [`slurm`] makes a run a good citizen of a Slurm allocation (requeue, srun stages).

pub mod attempt;
pub mod backoff;
pub mod channel;
pub mod checksum;
pub mod client;
pub mod console;
pub mod contract;
pub mod daemon;
pub mod echo;
pub mod error;
pub mod exit;
pub(crate) mod file_lock;
pub mod fingerprint;
pub mod forkserver;
pub mod gpu;
pub mod guard;
pub(crate) mod handover;
pub mod host;
pub mod journal;
pub mod outputs;
pub mod plan;
pub(crate) mod prepare;
pub mod proctree;
pub mod reaper;
pub mod rendezvous;
pub mod report;
pub mod results;
pub mod resume;
pub(crate) mod run_files;
pub mod rundir;
pub mod runner;
pub mod slurm;
pub mod sockets;
pub mod spawn;
pub mod stage;
pub mod state;
pub mod supervisor;
pub mod table;
#[cfg(test)]
mod testutil;
pub mod timefmt;
pub mod user_file;

//! Wire types shared by every part of the project, and nothing else (beyond the hasher that
//! defines what their checksums mean).
//!
//! - [`plan`]: the pipeline plan users write (TOML) and programs submit (JSON).
//! - [`worker`]: the contract between the orchestrator and a stage's processes: the
//!   [`worker::StageSpec`] handed to a built-in worker, the environment variables every stage
//!   gets, and the JSON-lines events any process of a stage may send back.
//! - [`checkpoint`]: the manifest that makes a stage's output directory verifiable, and the
//!   checksums it, the events, the journal and the report carry (with their one hasher, so
//!   that every side computes them alike).
//! - [`report`]: the per-run `report.json`.
//! - [`run`]: the per-run `run.json` (plan format and base directory).
//! - [`daemon`]: the requests, answers and run events of `orchestrate daemon`'s socket.
//! - [`fork`]: the fork server's requests and replies.
//! - [`web`]: the routes of the daemon's web view, which its server and its tests share.
//!
//! Every message carries [`PROTOCOL_VERSION`] in its `v` field; readers refuse versions they do
//! not know with a message saying which side to upgrade.

pub mod bytesize;
pub mod checkpoint;
pub mod daemon;
pub mod duration;
pub mod fork;
pub mod gpu_check;
pub mod journal;
pub mod plan;
pub mod preload;
pub mod report;
pub mod resume;
pub mod run;
pub mod status;
pub mod web;
pub mod worker;

/// Version of every JSON message and file format defined here. Bumped on incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

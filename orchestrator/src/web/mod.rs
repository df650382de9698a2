//! `orchestrate daemon --http [ADDR]`: a live web view of the daemon's runs and its GPUs'
//! memory, and `/metrics` for Prometheus.
//!
//! - [`listen`]: its addresses checked, its listeners bound, its token written, its tasks
//!   spawned;
//! - [`conn`]: a connection served by hyper's HTTP/1.1 with keep-alive, its limits set (head
//!   size, body size, head and write timeouts);
//! - [`http`]: the request and answer as the routes see them, the headers every answer has;
//! - [`admission`]: each listener's two connection budgets, one for connections without the
//!   token (the oldest dropped for a newer one), one for those being served;
//! - [`auth`]: the checks every request passes first (allowed `Host`, the token, a change's
//!   method and `Origin`), in the order of the route table [`protocol::web::ROUTES`];
//! - [`api`]: the routes' answers (JSON, the run's events as server-sent events, logs);
//! - [`state`]: what every request shares;
//! - [`frames`]: event frames encoded once for every page;
//! - [`feed`]: a live run's events in batches encoded once for all its pages, a large run's
//!   coalesced;
//! - [`runs_stream`]: the runs list, pushed as it changes, and the machine's GPUs;
//! - [`memory`]: the GPUs' memory and utilisation, sampled into a bounded ring;
//! - [`stage_meta`]: each run's stage kinds and matrix values, read from its plan once;
//! - [`metrics`]: the Prometheus exposition, labels bounded by GPUs and states;
//! - [`metrics_bind`]: `--metrics-addr`, `/metrics` alone on its own address, no token.
//!
//! Safe by default: it listens on loopback unless an address is given *and*
//! `--http-remote` allows it (with a warning); the token is printed as a URL and written 0600
//! beside the socket; nothing it serves runs a plan; its page and script are in the binary, so
//! nothing is fetched from elsewhere.

pub mod admission;
pub mod api;
pub mod auth;
pub mod cadence;
pub mod conn;
pub mod feed;
pub mod frames;
pub mod http;
pub mod listen;
pub mod memory;
pub mod metrics;
pub mod metrics_bind;
pub mod runs_stream;
pub mod stage_meta;
pub mod state;

pub use listen::{start, token_file, Running, WebConfig, WebError, DEFAULT_ADDR};

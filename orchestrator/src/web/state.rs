//! What every request of the web view shares.

use super::auth::Auth;
use super::feed::Feeds;
use super::memory::Memory;
use crate::daemon::Daemon;
use std::rc::Rc;

/// The web view's shared state.
pub struct Web {
    /// The daemon.
    pub daemon: Rc<Daemon>,
    /// The checks.
    pub auth: Auth,
    /// The GPUs' memory.
    pub memory: Memory,
    /// The live runs' feeds, one per run with a page open, and their encoded frames.
    pub feeds: Rc<Feeds>,
    /// Each run's stage kinds and matrix values, read from its plan once (see
    /// [`super::stage_meta`]), by run id.
    pub stage_meta:
        std::cell::RefCell<std::collections::HashMap<String, std::sync::Arc<serde_json::Value>>>,
}

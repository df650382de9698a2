//! What a run was set up with before its first stage: its plan, directory, journal, GPU
//! check and the services every attempt shares.

use super::placement::Placement;
use super::preflight::Cleared;
use crate::attempt::launch::Services;
use crate::events::journal::SharedJournal;
use crate::events::Events;
use crate::host::Ticket;
use crate::plan::fingerprint::Background;
use crate::plan::LoadedPlan;
use crate::store::rundir::RunDir;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

/// What the run was set up with before its first stage (see [`super::run`]).
pub(super) struct Setup {
    pub(super) plan: Arc<LoadedPlan>,
    pub(super) run_dir: RunDir,
    pub(super) worker: Option<PathBuf>,
    pub(super) events: Events,
    pub(super) resume: bool,
    pub(super) run_id: String,
    pub(super) ticket: Ticket,
    pub(super) placement: Placement,
    pub(super) cleared: Cleared,
    pub(super) journal: SharedJournal,
    pub(super) services: Rc<Services>,
    pub(super) fingerprints: Background,
    /// The report's stage records, kept from `events` (the run loop writes the report from
    /// them).
    pub(super) report: crate::report::stages::StageBook,
}

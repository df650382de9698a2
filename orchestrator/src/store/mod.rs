//! What makes a run durable: the run directory's layout ([`rundir`]) and its locks
//! (`file_lock`), the journal of every state change ([`journal`]), the fingerprints and
//! checksums that decide what a resumed run keeps ([`fingerprint`], `checksum`, [`resume`]),
//! bounded reads of the files users name (`user_file`), and the stage logs as they grow
//! ([`logs`]).

pub(crate) mod checksum;
pub(crate) mod file_lock;
pub mod fingerprint;
pub mod journal;
pub mod logs;
pub mod resume;
pub mod rundir;
pub(crate) mod user_file;

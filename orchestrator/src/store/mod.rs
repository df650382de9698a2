//! What makes a run durable: the run directory's layout ([`rundir`]) and its locks
//! (`file_lock`), the journal of every state change ([`journal`]), the checksums that tell
//! whether a recorded output is still what was written (`checksum`), bounded reads of the
//! files users name (`user_file`), and the stage logs as they grow ([`logs`]). What a resumed
//! run keeps is decided above, from these and the plan (`plan::fingerprint`, `run::resume`).

pub(crate) mod checksum;
pub(crate) mod file_lock;
pub mod journal;
pub mod logs;
pub mod rundir;
pub(crate) mod user_file;

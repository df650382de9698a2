//! One attempt of one stage: its files prepared (`prepare`, ahead of time by the
//! `preparer` thread), its contract with the stage (`contract`, `rendezvous`), its start
//! ([`launch`]), its supervision to a verdict (`supervise`) and how it ended ([`outcome`]), the
//! events it sends ([`channel`]), whether it hangs ([`stall`], with `hang_evidence`), its output shown as it comes (`echo`), its outputs checked
//! (`outputs`), and the stage that starts the moment it ends (`handover`).

pub mod channel;
pub(crate) mod contract;
pub(crate) mod echo;
pub(crate) mod flight_recorder;
pub(crate) mod gpu_faults;
pub(crate) mod handover;
pub(crate) mod hang_evidence;
pub mod launch;
pub mod outcome;
pub(crate) mod outputs;
pub(crate) mod prepare;
pub(crate) mod preparer;
pub mod ranks;
pub(crate) mod rendezvous;
pub mod stall;
pub(crate) mod supervise;
pub mod worker_binary;

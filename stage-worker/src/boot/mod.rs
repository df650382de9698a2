//! Getting a worker process to its stage: the command line and the stage spec, the signals it
//! answers, the fork server and its standbys (with the framed messages and the detaching that
//! both share), the device warm-up that overlaps a stage's start, and the `hold` fixture.

pub mod cli;
pub mod fork_messages;
pub mod forked_child;
pub mod forkserver;
pub mod hold;
pub mod signals;
pub mod spec;
pub mod standby;
pub mod warmup;

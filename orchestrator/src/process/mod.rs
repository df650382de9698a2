//! Processes: starting a stage's first process (by `clone` and exec, or through the fork
//! server), collecting exit statuses, finding every live process of a stage, and the guard that
//! kills them all if `orchestrate` dies.
//!
//! - [`spawn`]: the exec path, at a cost that does not grow with the orchestrator;
//! - `fork_server`: built-in workers forked from a warm `stage-worker`;
//! - `zygote`: Python command stages forked from a process that imported their `preload`;
//! - [`tree`]: starting and stopping a stage's process tree through either;
//! - [`reaper`]: the one place that reaps;
//! - `scan`: a stage's members, from `/proc`;
//! - [`cgroup`]: a cgroup v2 per stage, where the host delegates one;
//! - [`guard`]: the companion that outlives a crash;
//! - `backoff`: polling for what is expected to happen soon;
//! - `background`: threads whose work no stage waits for, at a lower CPU priority;
//! - [`discard`]: what is closed off the scheduling thread;
//! - [`exits`]: the exit statuses of processes others reap (where the kernel tells us);
//! - `kernel_file`: the kernel's small files in one read;
//! - [`pid_dirs`]: private directories named for their process, removed once it is gone;
//! - [`inherited`]: the descriptors `orchestrate` inherited, not passed on.

pub(crate) mod background;
pub(crate) mod backoff;
pub mod cgroup;
pub mod discard;
pub mod exits;
pub(crate) mod fork_server;
pub mod forkers;
pub mod guard;
pub mod inherited;
pub(crate) mod kernel_file;
pub mod pid_dirs;
pub mod reaper;
pub(crate) mod scan;
pub mod spawn;
pub mod tree;
pub(crate) mod zygote;

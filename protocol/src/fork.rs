//! The fork server's protocol: how the orchestrator asks a long-lived `stage-worker` process
//! (which has loaded libtorch but never touched CUDA) for a fresh worker process.
//!
//! Transport: one end of a Unix stream socket pair, inherited by the server as a file
//! descriptor named on its command line (`stage-worker fork-server --fd N`). Every message is a
//! 4-byte little-endian length followed by that many bytes of JSON. A [`ForkRequest`]'s length
//! prefix carries, as `SCM_RIGHTS`, exactly two descriptors: the new worker's stdout and
//! stderr. The server speaks first ([`ForkReply::Ready`] or [`ForkReply::Refused`]), then
//! answers each request with one reply. End of file on the socket stops the server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `stage-worker` subcommand that runs the fork server.
pub const FORK_SERVER_SUBCOMMAND: &str = "fork-server";

/// Environment variable naming a file whose existence the fork server treats as "a device was
/// initialised in this process" (tests: the refusal path on machines without a GPU).
pub const ENV_SIMULATED_DEVICE_FLAG: &str = "STAGE_WORKER_SIMULATED_DEVICE_FLAG";

/// Start one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkRequest {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// The worker's command line, as it would be exec'd (`stage-worker --spec PATH`).
    pub argv: Vec<String>,
    /// Its whole environment (replaces the server's).
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// PID of the process that must become the worker's parent (the orchestrator, a child
    /// subreaper and the server's parent): the worker waits to be re-parented to it, ties its
    /// `PR_SET_PDEATHSIG` to it, and exits at once if it is gone.
    pub parent: u32,
    /// The stage's cgroup directory, if it has one: the worker is born in it (the
    /// intermediate process moves itself in before forking it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// With `cgroup`: the intermediate process, once in it, enters a cgroup namespace of its
    /// own rooted there before it forks the worker (where the kernel allows), so that the
    /// worker is born in it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cgroup_namespace: bool,
    /// A standby rather than a worker: the child initialises the CUDA driver under `env`
    /// (`cuInit`: no context, no device memory, nothing NVML lists) and then waits on a third
    /// descriptor sent with the request (a stream socket) for an [`Adopt`] message, which
    /// makes it a stage's worker; `argv` is not run. The driver's start-up (about 0.1 s on an
    /// H200) is then paid while the previous stage still releases the GPU.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
}

/// Makes a standby (see [`ForkRequest::standby`]) the worker of a stage: sent on the
/// standby's own socket, framed as fork requests are, its length prefix carrying the stage's
/// stdout and stderr as `SCM_RIGHTS`. The standby answers [`ForkReply::Forked`] with its own
/// PID once it has taken on the stage's descriptors, environment and working directory (it
/// then runs `argv`), or [`ForkReply::Refused`] and exits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adopt {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// The worker's command line, as it would be exec'd.
    pub argv: Vec<String>,
    /// Its whole environment (replaces the standby's). Every variable the CUDA driver may
    /// have read at its start-up ([`driver_env`]) must be as in the standby's.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// The standby was moved into the stage's cgroup: it enters a cgroup namespace of its own
    /// rooted there before it runs the stage, where the kernel allows (as a forked or exec'd
    /// worker is born in one).
    #[serde(default)]
    pub cgroup_namespace: bool,
}

/// The variables of `env` that the CUDA driver and its loader may read when it starts
/// (`CUDA_*`, `NVIDIA_*`, `__NV*`, `LD_*`), sorted: a standby initialised under one
/// environment serves only a stage whose environment has the same ones.
pub fn driver_env<'a>(
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(&'a str, &'a str)> {
    let mut read: Vec<(&str, &str)> = env
        .into_iter()
        .filter(|(k, _)| {
            ["CUDA_", "NVIDIA_", "__NV", "LD_"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .collect();
    read.sort_unstable();
    read
}

/// A module a zygote left out of its imports, and why (see [`ForkReply::Ready`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LeftOut {
    /// The module.
    pub module: String,
    /// Why, for the user.
    pub reason: String,
}

/// What a Python zygote read ahead: the modules the script of the stage it was started for
/// imports at its top level, which it imported before it said it was ready (see
/// [`ForkReply::Ready`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReadAhead {
    /// The script, as the stage's command names it (`train.py`, `-m pkg.train`).
    pub script: String,
    /// Those of its imports the zygote imported (besides its preload list), in the script's
    /// order: a module (`a.b`), or `a.b:Name` for `from a.b import Name` (the module, then its
    /// attribute, which a lazily loading module loads on access).
    pub modules: Vec<String>,
}

/// What the server says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ForkReply {
    /// The server is up and may fork (sent once, first).
    Ready {
        /// The server's PID.
        pid: u32,
        /// Threads in the server (forking is only safe with one: orchestrate refuses a server
        /// that says more).
        threads: u32,
        /// Environment variables the server's start-up read (a Python zygote's preload
        /// imports): a worker whose value of one differs must not be forked from it. Absent
        /// from `stage-worker`'s server, which reads none that a stage sets.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env_read: Vec<String>,
        /// A Python zygote: modules it was asked to import because a stage had imported them
        /// (it learned them) and that it left out, and why (the import failed, started a
        /// thread, initialised CUDA, or read a variable set per stage).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        left_out: Vec<LeftOut>,
        /// A Python zygote: what it read ahead from the script of the stage it was started
        /// for, and imported (absent where it read no script).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        read_ahead: Option<ReadAhead>,
    },
    /// The server will not fork (sent instead of `Ready`, or to a request); it exits next.
    Refused {
        /// Why, for the user.
        reason: String,
    },
    /// The server will not fork this request because what it loaded no longer matches the
    /// disk (a Python zygote: a preloaded module's file changed, or a package was installed,
    /// upgraded or removed, since it imported them); it exits next. Unlike [`Self::Refused`],
    /// a fresh server started now would load the new code and may serve.
    Stale {
        /// What changed, for the user.
        reason: String,
    },
    /// A worker was started: it is now a child of the request's `parent`.
    Forked {
        /// The worker's PID.
        pid: u32,
        /// A Python zygote: what the stage's script imports at its top level that the zygote
        /// does not hold and could import (modules, or `module:Name`), for its next generation.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        lacks: Vec<String>,
    },
    /// This request failed (the server may serve the next one).
    Failed {
        /// Why.
        error: String,
    },
}

//! The `ORCHESTRATE_*` switches of the environment, read once when the process starts
//! ([`Settings::from_env`]) and handed to what they switch: nothing deeper in the crate reads
//! them. The lowest floor of the crate: it imports nothing of it.
//!
//! | variable | default | what it does |
//! |---|---|---|
//! | `ORCHESTRATE_FORK_SERVER` | on | built-in workers start through a fork server (`crate::process::fork_server`) |
//! | `ORCHESTRATE_STANDBY` | on | a fork server keeps a standby worker ready for the next stage |
//! | `ORCHESTRATE_ZYGOTE` | on | Python stages with `preload` are forked from a zygote (`crate::process::zygote`) |
//! | `ORCHESTRATE_CGROUPS` | on | stages run in cgroups of their own where cgroup v2 is delegated |
//! | `ORCHESTRATE_CGROUP_PARENT` | unset | the delegated cgroup to nest runs under, instead of this process's own |
//! | `ORCHESTRATE_CGROUP_NAMESPACES` | unset | `always`: each stage gets a cgroup namespace of its own wherever the kernel lets, not only where it confines (`crate::process::cgroup::namespace`) |
//! | `ORCHESTRATE_HAND_ON_AT_RELEASE` | on | a stage's GPUs are handed on when it releases them, not only when it ends |
//! | `ORCHESTRATE_EARLY_START` | on | a stage may start before its upstream stage ended (off also with the previous one off) |
//! | `ORCHESTRATE_NODE_CHECK_MAX_USED_MIB` | unset | the `--max-used-mib` of the GPU check of Slurm nodes |
//! | `ORCHESTRATE_MPS_CONTROL` | `nvidia-cuda-mps-control` | the MPS control program that `gpu_sharing = "mps"` starts (`crate::gpu::mps`) |
//!
//! Every on/off switch is read by [`switch`]: it is off when set to `0`, `off`, `false` or `no`
//! (any case, spaces around ignored), and on otherwise, unset included.

use std::path::PathBuf;

/// The `ORCHESTRATE_*` switches of this process (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `ORCHESTRATE_FORK_SERVER`.
    pub fork_server: bool,
    /// `ORCHESTRATE_STANDBY`.
    pub standby: bool,
    /// `ORCHESTRATE_ZYGOTE`.
    pub zygote: bool,
    /// `ORCHESTRATE_CGROUPS`.
    pub cgroups: bool,
    /// `ORCHESTRATE_CGROUP_PARENT`.
    pub cgroup_parent: Option<PathBuf>,
    /// `ORCHESTRATE_CGROUP_NAMESPACES` is `always` (any case, trimmed).
    pub cgroup_namespaces_always: bool,
    /// `ORCHESTRATE_HAND_ON_AT_RELEASE`.
    pub hand_on_at_release: bool,
    /// `ORCHESTRATE_EARLY_START`.
    pub early_start: bool,
    /// `ORCHESTRATE_NODE_CHECK_MAX_USED_MIB`, as given.
    pub node_check_max_used_mib: Option<String>,
    /// `ORCHESTRATE_MPS_CONTROL`: the MPS control program (a name looked up on `PATH`, or a
    /// path).
    pub mps_control: PathBuf,
}

/// `ORCHESTRATE_FORK_SERVER`.
pub const FORK_SERVER: &str = "ORCHESTRATE_FORK_SERVER";
/// `ORCHESTRATE_STANDBY`.
pub const STANDBY: &str = "ORCHESTRATE_STANDBY";
/// `ORCHESTRATE_ZYGOTE`.
pub const ZYGOTE: &str = "ORCHESTRATE_ZYGOTE";
/// `ORCHESTRATE_CGROUPS`.
pub const CGROUPS: &str = "ORCHESTRATE_CGROUPS";
/// `ORCHESTRATE_CGROUP_PARENT`.
pub const CGROUP_PARENT: &str = "ORCHESTRATE_CGROUP_PARENT";
/// `ORCHESTRATE_CGROUP_NAMESPACES`.
pub const CGROUP_NAMESPACES: &str = "ORCHESTRATE_CGROUP_NAMESPACES";
/// `ORCHESTRATE_HAND_ON_AT_RELEASE`.
pub const HAND_ON_AT_RELEASE: &str = "ORCHESTRATE_HAND_ON_AT_RELEASE";
/// `ORCHESTRATE_EARLY_START`.
pub const EARLY_START: &str = "ORCHESTRATE_EARLY_START";
/// `ORCHESTRATE_NODE_CHECK_MAX_USED_MIB`.
pub const NODE_CHECK_MAX_USED_MIB: &str = "ORCHESTRATE_NODE_CHECK_MAX_USED_MIB";
/// `ORCHESTRATE_MPS_CONTROL`.
pub const MPS_CONTROL: &str = "ORCHESTRATE_MPS_CONTROL";
/// The MPS control program NVIDIA's driver installs.
pub const DEFAULT_MPS_CONTROL: &str = "nvidia-cuda-mps-control";

impl Settings {
    /// The switches as this process's environment sets them.
    pub fn from_env() -> Settings {
        Settings::from_vars(|name| std::env::var(name).ok())
    }

    /// The switches as `get` gives the variables.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Settings {
        let on = |name: &str| switch(get(name).as_deref());
        Settings {
            fork_server: on(FORK_SERVER),
            standby: on(STANDBY),
            zygote: on(ZYGOTE),
            cgroups: on(CGROUPS),
            cgroup_parent: get(CGROUP_PARENT).map(PathBuf::from),
            cgroup_namespaces_always: get(CGROUP_NAMESPACES)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("always")),
            hand_on_at_release: on(HAND_ON_AT_RELEASE),
            early_start: on(EARLY_START),
            node_check_max_used_mib: get(NODE_CHECK_MAX_USED_MIB),
            mps_control: get(MPS_CONTROL)
                .filter(|p| !p.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_MPS_CONTROL.into())
                .into(),
        }
    }

    /// Whether this process starts stages early: with both the early start and the hand-on
    /// at release on.
    pub fn starts_early(&self) -> bool {
        self.early_start && self.hand_on_at_release
    }
}

impl Default for Settings {
    /// Every switch on, nothing set: the settings of an empty environment.
    fn default() -> Settings {
        Settings::from_vars(|_| None)
    }
}

/// An on/off switch's value: off for `0`, `off`, `false`, `no` (any case, trimmed), on
/// otherwise and when unset.
pub fn switch(value: Option<&str>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let value = value.trim().to_ascii_lowercase();
    !matches!(value.as_str(), "0" | "off" | "false" | "no")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_off_only_when_said_so() {
        for off in ["0", "off", "false", "no", " OFF ", "False"] {
            assert!(!switch(Some(off)), "{off:?}");
        }
        for on in [None, Some(""), Some("1"), Some("on"), Some("yes")] {
            assert!(switch(on), "{on:?}");
        }
    }

    #[test]
    fn every_switch_is_read_by_its_name() {
        let all_off = Settings::from_vars(|name| match name {
            CGROUP_PARENT => Some("/sys/fs/cgroup/x".into()),
            CGROUP_NAMESPACES => Some(" Always ".into()),
            NODE_CHECK_MAX_USED_MIB => Some("512".into()),
            MPS_CONTROL => Some("/opt/nvidia/mps-control".into()),
            _ => Some("off".into()),
        });
        assert_eq!(
            all_off.mps_control,
            PathBuf::from("/opt/nvidia/mps-control")
        );
        assert!(!all_off.fork_server && !all_off.standby && !all_off.zygote);
        assert!(!all_off.cgroups && !all_off.hand_on_at_release && !all_off.early_start);
        assert_eq!(
            all_off.cgroup_parent,
            Some(PathBuf::from("/sys/fs/cgroup/x"))
        );
        assert_eq!(all_off.node_check_max_used_mib.as_deref(), Some("512"));
        assert!(all_off.cgroup_namespaces_always);
        let default = Settings::default();
        assert!(!default.cgroup_namespaces_always);
        assert_eq!(default.mps_control, PathBuf::from(DEFAULT_MPS_CONTROL));
        assert!(default.fork_server && default.starts_early() && default.cgroups);
        let no_hand_on = Settings::from_vars(|n| (n == HAND_ON_AT_RELEASE).then(|| "0".into()));
        assert!(!no_hand_on.starts_early(), "no hand-on, no early start");
    }
}

//! What the host's cgroups offer this process: where cgroup v2 is mounted, the cgroup this
//! process is in, which controllers its children may use, and which are held by cgroup v1.
//!
//! Read from `/proc/self/mountinfo`, `/proc/self/cgroup` and the cgroup's own files; nothing
//! is changed. The parsers take text, so that layouts this machine does not have (a
//! delegated hierarchy, a Slurm step's cgroup) are tested too.

use std::path::{Path, PathBuf};

/// Controllers a stage's limits use: `memory` (`memory.max`), `pids` (`pids.max`) and `cpu`
/// (`cpu.max`).
pub const LIMIT_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The host's cgroups as this process sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCgroups {
    /// Where the cgroup v2 hierarchy is mounted, if it is.
    pub v2_mount: Option<PathBuf>,
    /// The cgroup v2 directory runs nest under: `ORCHESTRATE_CGROUP_PARENT` where set (a
    /// subtree delegated to `orchestrate`), else this process's own cgroup.
    pub own: Option<PathBuf>,
    /// Controllers a child of `own` may enable (`own`'s `cgroup.subtree_control`).
    pub delegated: Vec<String>,
    /// Controllers `own` has (`cgroup.controllers`), enabled for its children or not.
    pub available: Vec<String>,
    /// Controllers mounted as cgroup v1 (a hybrid layout), which v2 cannot use.
    pub v1: Vec<String>,
    /// Whether a child cgroup can be made in `own` (written to), or why not.
    pub writable: Result<(), String>,
    /// `ORCHESTRATE_CGROUP_NAMESPACES=always`: a cgroup namespace per stage wherever the
    /// kernel lets, not only where it confines (see [`HostCgroups::stage_namespaces`]).
    pub namespaces_always: bool,
}

impl HostCgroups {
    /// Reads the host's layout; `ORCHESTRATE_CGROUPS=0` (or `off`, `false`, `no`:
    /// `settings.cgroups`) makes it report no cgroup v2 at all. `ORCHESTRATE_CGROUP_PARENT=DIR`
    /// (`settings.cgroup_parent`) names the delegated cgroup to nest runs under instead of this
    /// process's own (which, holding this process, can give its children no controller unless
    /// it is the root).
    pub fn detect(settings: &crate::settings::Settings) -> HostCgroups {
        if !settings.cgroups {
            return HostCgroups {
                v2_mount: None,
                own: None,
                delegated: Vec::new(),
                available: Vec::new(),
                v1: Vec::new(),
                writable: Err("cgroups are turned off (ORCHESTRATE_CGROUPS=0)".into()),
                namespaces_always: settings.cgroup_namespaces_always,
            };
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let (v2_mount, v1) = parse_mounts(&mountinfo);
        let parent = settings.cgroup_parent.clone();
        let own = match (&v2_mount, v2_path(&membership), &parent) {
            (Some(mount), _, Some(dir)) if dir.starts_with(mount) => Some(dir.clone()),
            (_, _, Some(_)) => None,
            (Some(mount), Some(path), None) => Some(mount.join(path.trim_start_matches('/'))),
            _ => None,
        };
        let words = |dir: &Path, file: &str| -> Vec<String> {
            std::fs::read_to_string(dir.join(file))
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        let (delegated, available, writable) = match &own {
            Some(dir) if !dir.join("cgroup.procs").exists() => (
                Vec::new(),
                Vec::new(),
                Err(format!("{} is not a cgroup v2 directory", dir.display())),
            ),
            Some(dir) => (
                words(dir, "cgroup.subtree_control"),
                words(dir, "cgroup.controllers"),
                access_to(dir),
            ),
            None => (
                Vec::new(),
                Vec::new(),
                Err(match parent {
                    Some(dir) => format!(
                        "ORCHESTRATE_CGROUP_PARENT={} is not in the cgroup v2 hierarchy",
                        dir.display()
                    ),
                    None => "no cgroup v2 hierarchy is mounted".into(),
                }),
            ),
        };
        HostCgroups {
            v2_mount,
            own,
            delegated,
            available,
            v1,
            writable,
            namespaces_always: settings.cgroup_namespaces_always,
        }
    }

    /// Whether each stage's processes enter a cgroup namespace of their own, rooted at its
    /// cgroup ([`super::namespace::Support::per_stage`]: where it confines, or where the
    /// kernel lets with `ORCHESTRATE_CGROUP_NAMESPACES=always`).
    pub fn stage_namespaces(&self) -> bool {
        super::namespace::Support::here().per_stage(self.namespaces_always)
    }

    /// What [`HostCgroups::stage_namespaces`] gives, and why, for `orchestrate doctor` and a
    /// run's isolation line.
    pub fn describe_namespaces(&self) -> String {
        super::namespace::Support::here().describe(self.namespaces_always)
    }

    /// Whether stages can have cgroups of their own here (membership and `cgroup.kill`; limits
    /// need [`HostCgroups::can_limit`] too).
    pub fn usable(&self) -> bool {
        self.own.is_some() && self.writable.is_ok()
    }

    /// Whether a child cgroup can use `controller`, or why not, phrased for the user.
    pub fn can_limit(&self, controller: &str) -> Result<(), String> {
        if let Err(why) = &self.writable {
            return Err(why.clone());
        }
        let own = self.own.as_deref().unwrap_or(Path::new("?"));
        if self.delegated.iter().any(|c| c == controller) {
            return Ok(());
        }
        if self.v1.iter().any(|c| c == controller) {
            return Err(format!(
                "the `{controller}` controller is on cgroup v1 here (a hybrid layout), which gives it to no cgroup v2 group"
            ));
        }
        if self.available.iter().any(|c| c == controller) {
            return Err(format!(
                "`{controller}` is not enabled for the children of {} (its cgroup.subtree_control has `{}`); enable it with `echo +{controller} > {}`",
                own.display(),
                self.delegated.join(" "),
                own.join("cgroup.subtree_control").display()
            ));
        }
        Err(format!(
            "cgroup {} has no `{controller}` controller (it has `{}`)",
            own.display(),
            self.available.join(" ")
        ))
    }

    /// One line for `orchestrate doctor`.
    pub fn describe(&self) -> String {
        let Some(own) = &self.own else {
            let why = self.writable.as_ref().err().cloned().unwrap_or_default();
            return format!("cgroups: process groups only ({why})");
        };
        let mut line = match &self.writable {
            Ok(()) => format!(
                "cgroups: v2 at {}; stages get a cgroup each (membership, cgroup.kill)",
                own.display()
            ),
            Err(why) => format!(
                "cgroups: v2 at {}, but process groups only: {why}",
                own.display()
            ),
        };
        let limits: Vec<String> = LIMIT_CONTROLLERS
            .iter()
            .map(|c| match self.can_limit(c) {
                Ok(()) => format!("{c}: yes"),
                Err(_) if self.v1.iter().any(|v| v == c) => format!("{c}: no (cgroup v1)"),
                Err(_) => format!("{c}: no"),
            })
            .collect();
        line.push_str(&format!("; limits: {}", limits.join(", ")));
        line
    }
}

/// Whether this (root) process may make a cgroup in `dir`.
fn access_to(dir: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return Err(format!("{} is not a usable path", dir.display()));
    };
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(format!(
            "this user may not create cgroups in {} ({}); ask for a delegated subtree",
            dir.display(),
            std::io::Error::last_os_error()
        ))
    }
}

/// The cgroup v2 mount point and the controllers mounted as cgroup v1, from
/// `/proc/self/mountinfo`.
pub fn parse_mounts(mountinfo: &str) -> (Option<PathBuf>, Vec<String>) {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (Some(fstype), _source, Some(options)) = (right.next(), right.next(), right.next())
        else {
            continue;
        };
        let Some(mount) = left.split_whitespace().nth(4) else {
            continue;
        };
        match fstype {
            "cgroup2" if v2.is_none() => v2 = Some(PathBuf::from(unescape(mount))),
            "cgroup" => v1.extend(
                options
                    .split(',')
                    .filter(|o| {
                        !matches!(
                            *o,
                            "rw" | "ro"
                                | "xattr"
                                | "noprefix"
                                | "clone_children"
                                | "cpuset_v2_mode"
                        ) && !o.contains('=')
                    })
                    .map(String::from),
            ),
            _ => {}
        }
    }
    (v2, v1)
}

/// The cgroup v2 path (the `0::` line) of `/proc/self/cgroup`.
pub fn v2_path(membership: &str) -> Option<&str> {
    membership
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
}

/// `mountinfo` writes space, tab, newline and backslash as octal escapes.
fn unescape(text: &str) -> String {
    text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
";
    const UNIFIED: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn a_hybrid_layout_names_the_v1_controllers_and_the_v2_mount() {
        let (v2, v1) = parse_mounts(HYBRID);
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(v1, ["memory", "cpu", "cpuacct"]);
        let (v2, v1) = parse_mounts(UNIFIED);
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup")));
        assert!(v1.is_empty());
        assert_eq!(
            v2_path("12:memory:/x\n0::/slurm/uid_0/job_7/step_0\n"),
            Some("/slurm/uid_0/job_7/step_0")
        );
        assert_eq!(v2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn a_limit_is_possible_only_with_its_controller_delegated_and_the_refusal_says_why() {
        let hybrid = HostCgroups {
            v2_mount: Some("/sys/fs/cgroup/unified".into()),
            own: Some("/sys/fs/cgroup/unified".into()),
            delegated: vec![],
            available: vec!["hugetlb".into()],
            v1: vec!["memory".into(), "pids".into()],
            writable: Ok(()),
            namespaces_always: false,
        };
        assert!(hybrid.usable());
        let why = hybrid.can_limit("memory").unwrap_err();
        assert!(why.contains("cgroup v1"), "{why}");
        let why = hybrid.can_limit("cpu").unwrap_err();
        assert!(why.contains("no `cpu` controller"), "{why}");
        assert!(hybrid.describe().contains("memory: no (cgroup v1)"));
        let delegated = HostCgroups {
            delegated: vec!["cpu".into(), "memory".into(), "pids".into()],
            available: vec!["cpu".into(), "memory".into(), "pids".into(), "io".into()],
            v1: vec![],
            ..hybrid.clone()
        };
        assert_eq!(delegated.can_limit("memory"), Ok(()));
        assert!(delegated
            .describe()
            .contains("memory: yes, pids: yes, cpu: yes"));
        let not_enabled = HostCgroups {
            delegated: vec!["cpu".into()],
            ..delegated.clone()
        };
        let why = not_enabled.can_limit("memory").unwrap_err();
        assert!(why.contains("echo +memory >"), "{why}");
        let no_write = HostCgroups {
            writable: Err("this user may not create cgroups".into()),
            ..delegated
        };
        assert!(!no_write.usable());
        assert!(no_write.can_limit("memory").is_err());
    }
}

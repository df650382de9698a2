//! What a stage's host limits get on this host: enforced by its cgroup, left to Slurm's, or
//! refused before the run starts. Never silently ignored.

use super::host::HostCgroups;
use super::Limits;

/// How a stage's limits are handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The stage asks for none.
    NoLimits,
    /// Its own cgroup enforces them.
    Enforced,
    /// Inside a Slurm job whose cgroup does not delegate them: the job's own limits apply,
    /// and the run says so (the line).
    LeftToSlurm(String),
    /// They cannot be enforced here: the run is refused, with this reason.
    Refused(String),
}

/// Judges `limits` of a stage on `host`; `in_slurm`: the run is inside a Slurm job;
/// `through_srun`: the stage runs its tasks through `srun` (in Slurm's cgroups, not ours).
pub fn judge(host: &HostCgroups, limits: &Limits, in_slurm: bool, through_srun: bool) -> Judgement {
    let keys = limits.requested();
    if keys.is_empty() {
        return Judgement::NoLimits;
    }
    let named = keys
        .iter()
        .map(|(key, _)| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if through_srun {
        return Judgement::Refused(format!(
            "{named} cannot be enforced on a stage that runs through srun: its tasks run in Slurm's cgroups; ask Slurm instead (sbatch --mem, --cpus-per-task)"
        ));
    }
    let missing: Vec<String> = keys
        .iter()
        .filter_map(|(key, controller)| {
            host.can_limit(controller)
                .err()
                .map(|why| format!("`{key}` needs the `{controller}` controller: {why}"))
        })
        .collect();
    if missing.is_empty() {
        return Judgement::Enforced;
    }
    if in_slurm {
        return Judgement::LeftToSlurm(format!(
            "{named} left to the Slurm job's own limits (its cgroup does not let orchestrate nest one per stage: {})",
            missing.join("; ")
        ));
    }
    Judgement::Refused(format!(
        "this host cannot enforce it ({}); run on a host that delegates cgroup v2 with these controllers, or remove {named}",
        missing.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(delegated: &[&str], v1: &[&str]) -> HostCgroups {
        HostCgroups {
            v2_mount: Some("/sys/fs/cgroup".into()),
            own: Some("/sys/fs/cgroup/job_7/step_0".into()),
            delegated: delegated.iter().map(|s| s.to_string()).collect(),
            available: delegated.iter().map(|s| s.to_string()).collect(),
            v1: v1.iter().map(|s| s.to_string()).collect(),
            writable: Ok(()),
            namespaces_always: false,
        }
    }

    const MEMORY: Limits = Limits {
        memory: Some(256 << 20),
        pids: None,
        cpus: None,
    };

    #[test]
    fn limits_are_enforced_refused_or_left_to_slurm_never_ignored() {
        let none = Limits::default();
        assert_eq!(
            judge(&host(&[], &[]), &none, false, false),
            Judgement::NoLimits
        );
        let delegated = host(&["memory", "pids", "cpu"], &[]);
        assert_eq!(
            judge(&delegated, &MEMORY, false, false),
            Judgement::Enforced
        );
        assert_eq!(judge(&delegated, &MEMORY, true, false), Judgement::Enforced);
        // A hybrid host: refused outside Slurm, left to the job inside it.
        let hybrid = host(&[], &["memory"]);
        let Judgement::Refused(why) = judge(&hybrid, &MEMORY, false, false) else {
            panic!("a hybrid host must refuse a memory limit");
        };
        assert!(
            why.contains("`memory` needs the `memory` controller"),
            "{why}"
        );
        assert!(why.contains("cgroup v1"), "{why}");
        let Judgement::LeftToSlurm(line) = judge(&hybrid, &MEMORY, true, false) else {
            panic!("inside Slurm the job's limits apply");
        };
        assert!(line.contains("left to the Slurm job"), "{line}");
        // Only the missing controller is named.
        let pids_only = host(&["memory"], &[]);
        let both = Limits {
            pids: Some(64),
            ..MEMORY
        };
        let Judgement::Refused(why) = judge(&pids_only, &both, false, false) else {
            panic!("pids is not delegated");
        };
        assert!(
            why.contains("`pids` needs") && !why.contains("`memory` needs"),
            "{why}"
        );
        // A stage run through srun is in Slurm's cgroups, whatever this host delegates.
        assert!(matches!(
            judge(&delegated, &MEMORY, true, true),
            Judgement::Refused(why) if why.contains("srun")
        ));
    }
}

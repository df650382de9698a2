//! `orchestrate doctor`: what this host offers stages.

use orchestrator::process::cgroup::host::HostCgroups;
use std::process::ExitCode;

/// Prints one line on the host's cgroups (see [`HostCgroups::describe`]), one on the stages'
/// cgroup namespaces where stages get cgroups, and, inside a Slurm job, one on where stage
/// cgroups would nest.
pub(crate) fn doctor() -> ExitCode {
    let host = HostCgroups::detect();
    println!("{}", host.describe());
    if host.usable() {
        println!(
            "cgroup namespaces: {}",
            orchestrator::process::cgroup::namespace::Support::here().describe()
        );
    }
    if orchestrator::slurm::Allocation::detect().is_some() {
        let own = host
            .own
            .as_ref()
            .map_or("none".to_string(), |p| p.display().to_string());
        let limits_ok = ["memory", "pids", "cpu"]
            .iter()
            .all(|c| host.can_limit(c).is_ok());
        println!(
            "slurm: inside a job; stage cgroups nest under the job's own ({own}){}",
            if limits_ok {
                ""
            } else {
                "; limits it does not delegate are left to Slurm's"
            }
        );
    }
    ExitCode::SUCCESS
}

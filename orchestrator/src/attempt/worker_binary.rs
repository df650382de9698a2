//! Where the built-in stage worker (`stage-worker`) is: named by the user, beside this
//! executable (a `cargo build`, a `cargo install`, a wheel's `bin/`), or on `PATH`.

use crate::error::{Context, Error};
use crate::plan::LoadedPlan;
use std::path::{Path, PathBuf};

/// The two ways to get a worker, for the refusal and for `orchestrate doctor`: the wheel beside
/// an installed torch 2.11.0, or a build from a clone (or `cargo install`) against libtorch.
pub const HOW_TO_GET_ONE: &str = "install the orchestrate-worker wheel into the Python environment that has torch 2.11.0 (`scripts/build-worker-wheel`, then `pip install dist/orchestrate_worker-*.whl`: its bin/stage-worker uses that torch's libtorch), or build it from a clone of the repository (`scripts/setup-libtorch && cargo build --release --locked -p stage-worker`, then put target/release/stage-worker beside orchestrate or on PATH; or `LIBTORCH=... cargo install --locked --path stage-worker`); see docs/install.md";

/// Finds the `stage-worker` binary: the explicit path (`--worker`), the plan's `run.worker`
/// (relative to the plan's directory), `$ORCHESTRATE_WORKER`, the file beside this executable,
/// or the first `stage-worker` on `PATH`. A path the user named must exist; with none named and
/// none found, the run is refused (before anything runs) with the ways to get one.
pub fn resolve_worker(explicit: Option<&Path>, plan: &LoadedPlan) -> crate::error::Result<PathBuf> {
    let named = if let Some(p) = explicit {
        Some(p.to_path_buf())
    } else if let Some(p) = &plan.plan.run.worker {
        Some(plan.base_dir.join(p))
    } else {
        std::env::var_os("ORCHESTRATE_WORKER").map(PathBuf::from)
    };
    if let Some(candidate) = named {
        if !candidate.is_file() {
            return Err(Error::Refused(format!(
                "the built-in stage worker was not found at {}: point `run.worker` in the plan, --worker or ORCHESTRATE_WORKER at a stage-worker binary, or {HOW_TO_GET_ONE}",
                candidate.display()
            )));
        }
        return Ok(candidate);
    }
    let beside = beside_this_executable().context("cannot find this executable's path")?;
    find_installed(&beside).ok_or_else(|| {
        Error::Refused(format!(
            "this plan has built-in stages (`kind`) but no stage-worker was found beside {} or on PATH: {HOW_TO_GET_ONE}",
            beside.parent().unwrap_or(Path::new("/")).display()
        ))
    })
}

/// `stage-worker` in this executable's directory (it need not exist).
pub fn beside_this_executable() -> std::io::Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name("stage-worker"))
}

/// `beside` when it is a file, else the first executable `stage-worker` on `PATH`.
pub fn find_installed(beside: &Path) -> Option<PathBuf> {
    if beside.is_file() {
        return Some(beside.to_path_buf());
    }
    on_path("stage-worker")
}

/// The first executable file called `name` in a directory of `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

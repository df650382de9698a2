//! The arguments of both hidden subcommands a stage run through srun is made of: the launcher
//! (`launch`) and the per-task wrapper (`task`), and the names the side that builds the srun
//! command line (`srun`) shares with them. The lowest file of the srun launch: it imports
//! nothing of `slurm`, so the launcher, the wrapper and the command line never import each
//! other for a name.

use std::path::PathBuf;

/// The hidden subcommand that runs the launcher (`super::launch`).
pub(crate) const LAUNCH_SUBCOMMAND: &str = "__slurm-srun";

/// The hidden subcommand that runs the per-task wrapper (`super::task`).
pub const TASK_SUBCOMMAND: &str = "__slurm-task";

/// Set (to 1) in the environment of a step that is one placed stage instance
/// ([`super::placement`]): its wrapper runs the command in a session of its own, kills and
/// reaps what is left of it, and checks the node's GPUs before it exits.
pub const ENV_PLACED: &str = "ORCHESTRATE_PLACED_STEP";

/// Where `orchestrate` itself is, for srun to start the wrapper and the GPU check with.
pub fn orchestrate_exe() -> String {
    std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "orchestrate".into())
}

/// The arguments of both hidden subcommands: `[--records DIR] -- PROGRAM ARGS…`. `Err` is the
/// exit status after saying what is wrong.
pub(crate) fn parse(
    subcommand: &str,
    args: Vec<String>,
) -> Result<(Option<PathBuf>, Vec<String>), i32> {
    let mut records: Option<PathBuf> = None;
    let mut rest = args.into_iter();
    let mut program: Vec<String> = Vec::new();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--records" => records = rest.next().map(PathBuf::from),
            "--" => {
                program = rest.by_ref().collect();
                break;
            }
            other => {
                eprintln!("orchestrate {subcommand}: unexpected argument `{other}`");
                return Err(2);
            }
        }
    }
    if program.is_empty() {
        eprintln!("orchestrate {subcommand}: no program after `--`");
        return Err(2);
    }
    Ok((records, program))
}

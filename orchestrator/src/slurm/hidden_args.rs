//! The arguments of both hidden subcommands a stage run through srun is made of: the launcher
//! (`launch`) and the per-task wrapper (`task`).

use std::path::PathBuf;

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

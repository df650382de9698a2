//! Exit statuses of `orchestrate`, in one place; the README ("Exit status") and
//! `orchestrate --help` list them for users.

/// Every stage succeeded and every GPU check passed.
pub const SUCCESS: i32 = 0;
/// At least one stage failed (after its retries).
pub(crate) const STAGE_FAILED: i32 = 1;
/// The plan or the command-line arguments are invalid; nothing ran.
pub const INVALID_INPUT: i32 = 2;
/// A GPU check found leaked memory: the run ends `leaked` under `on_leak = "fail"`, else
/// (every stage succeeded) "succeeded with leaked GPU memory" — never 0.
pub const GPU_LEAK: i32 = 3;
/// The run could not be set up or carried on (run directory, NVML required but absent, I/O).
pub const RUN_ERROR: i32 = 4;
/// Stopped by SIGINT, SIGTERM or SIGHUP; running stages were stopped and the journal says where.
pub(crate) const INTERRUPTED: i32 = 130;
/// Inside a Slurm job: stopped by the warning signal or SIGTERM, running stages stopped and
/// checkpointed, and the job requeued (`scontrol requeue`); its next start resumes the run.
pub(crate) const REQUEUED: i32 = 75;

/// Every exit status `orchestrate` uses, with the word the README's "Exit status" paragraph
/// and `orchestrate --help` use for it (a test holds both to this list).
pub const ALL: &[(i32, &str)] = &[
    (SUCCESS, "every stage succeeded"),
    (STAGE_FAILED, "a stage failed"),
    (INVALID_INPUT, "invalid plan or arguments"),
    (GPU_LEAK, "a GPU leaked"),
    (RUN_ERROR, "the run could not be set up or carried on"),
    (REQUEUED, "inside a Slurm job"),
    (INTERRUPTED, "interrupted by SIGINT, SIGTERM or SIGHUP"),
];

#[cfg(test)]
mod tests {
    /// The rows of the README's "Exit status" table: (code, meaning).
    fn readme_exit_status() -> Vec<(i32, String)> {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let start = readme
            .find("## Exit status")
            .expect("an Exit status section");
        readme[start..]
            .lines()
            .skip(1)
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                Some((cells.get(1)?.parse().ok()?, cells.get(2)?.to_string()))
            })
            .collect()
    }

    #[test]
    fn the_readme_lists_every_exit_status_with_its_meaning_and_no_other() {
        let rows = readme_exit_status();
        for (code, meaning) in super::ALL {
            assert!(
                rows.iter().any(|(c, m)| c == code && m.contains(meaning)),
                "README lacks `{code}` {meaning:?}: {rows:?}"
            );
        }
        assert_eq!(rows.len(), super::ALL.len(), "{rows:?}");
    }
}

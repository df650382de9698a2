//! Checks of a stage's `srun` layout (`nodes`, `tasks_per_node`, `gpus_per_task`): positive
//! numbers, a command stage, and GPUs asked of Slurm rather than of the orchestrator's pool.

use super::validate::Validator;

/// More tasks than any allocation would give one stage: a typo, not a plan.
const MAX_TASKS: u64 = 1 << 16;

impl Validator<'_, '_, '_> {
    /// A stage that runs through `srun`: whole numbers ≥ 1, a `command` (the built-in worker is
    /// one process), and `gpus_per_task` instead of `gpus`.
    pub(super) fn check_task_layout(&mut self, i: usize) {
        let stage = self.stage(i);
        let Some(layout) = stage.task_layout() else {
            return;
        };
        for (key, value) in [
            ("nodes", stage.nodes),
            ("tasks_per_node", stage.tasks_per_node),
            ("gpus_per_task", stage.gpus_per_task),
        ] {
            if value == Some(0) {
                self.error(
                    self.field(i, key),
                    i,
                    format!("`{key}` is zero"),
                    Some(format!("give `{key}` a whole number ≥ 1, or leave it out")),
                );
            }
        }
        if u64::from(layout.nodes) * u64::from(layout.tasks_per_node) > MAX_TASKS {
            self.error(
                self.field(i, "tasks_per_node"),
                i,
                format!(
                    "{} nodes × {} tasks per node is more than {MAX_TASKS} tasks",
                    layout.nodes, layout.tasks_per_node
                ),
                None,
            );
        }
        if stage.kind.is_some() {
            self.error(
                self.field(i, "kind"),
                i,
                "`nodes`, `tasks_per_node` and `gpus_per_task` launch a distributed program through srun, but the built-in worker is a single process".into(),
                Some("give the stage a `command` (your torch.distributed program), or remove the srun settings".into()),
            );
        }
        if stage.gpus.is_some() {
            self.error(
                self.field(i, "gpus"),
                i,
                "`gpus` cannot be combined with `nodes`/`tasks_per_node`/`gpus_per_task`: srun stages get their GPUs from Slurm".into(),
                Some("use `gpus_per_task` instead".into()),
            );
        }
    }
}

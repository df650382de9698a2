//! Checks of `preload`, the modules a Python command stage's zygote imports (or `"auto"`,
//! parsed by [`protocol::plan::Preload`]): module names, and command stages only.

use super::validate::Validator;

/// Why `name` cannot be imported as written (`import NAME`), if it cannot.
fn module_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    let part_ok = |part: &str| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_')
    };
    (!name.split('.').all(part_ok)).then_some("is not a module name (dotted identifiers, like \"torch\" or \"transformers.models.llama\")")
}

impl Validator<'_, '_, '_> {
    /// `run.preload`: module names.
    pub(super) fn check_run_preload(&mut self, span: Option<std::ops::Range<usize>>) {
        for (j, name) in self.plan.run.preload.modules().iter().enumerate() {
            if let Some(problem) = module_problem(name) {
                self.rep.error(
                    span.clone(),
                    None,
                    format!("`run.preload[{j}]` ({name:?}) {problem}"),
                    None,
                );
            }
        }
    }

    /// A stage's `preload`: module names, on a command stage.
    pub(super) fn check_preload(&mut self, i: usize) {
        let stage = self.stage(i);
        let Some(preload) = &stage.preload else {
            return;
        };
        if stage.kind.is_some() {
            self.error(
                self.field(i, "preload"),
                i,
                "`preload` is for command stages; a built-in stage is already forked from a warm `stage-worker`".into(),
                Some("remove `preload` from this stage".into()),
            );
            return;
        }
        for (j, name) in preload.modules().iter().enumerate() {
            if let Some(problem) = module_problem(name) {
                self.error(
                    self.item(i, "preload", j),
                    i,
                    format!("`preload[{j}]` ({name:?}) {problem}"),
                    None,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::module_problem;

    #[test]
    fn module_names() {
        for ok in ["torch", "transformers.models.llama", "_private", "m2"] {
            assert_eq!(module_problem(ok), None, "{ok}");
        }
        for bad in ["", "torch.", "2fast", "a-b", "a b", "os/path"] {
            assert!(module_problem(bad).is_some(), "{bad}");
        }
    }
}

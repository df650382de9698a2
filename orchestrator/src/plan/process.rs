//! Checks of what a stage's process is given: its program (`kind` or `command`, placeholders
//! included), its environment and the outputs it must leave.

use super::placeholder::{self, Piece, Placeholder, TEMPLATE_HELP};
use super::tree::Node;
use super::validate::{Validator, RESERVED_ENV_PREFIX};
use protocol::plan::BuiltinKind;
use std::path::{Component, Path};

/// Whether `name` can be an environment variable's name.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Validator<'_, '_, '_> {
    /// `kind` or `command`, exactly one; a command's program and placeholders.
    pub(super) fn check_program(&mut self, i: usize, upstream: &[Vec<usize>]) {
        let stage = self.stage(i);
        let command = match (&stage.kind, &stage.command) {
            (Some(_), Some(_)) => {
                self.error(
                    self.field(i, "command"),
                    i,
                    "the stage has both `kind` and `command`".into(),
                    Some("`kind` runs the built-in stage-worker, `command` runs any program: keep one".into()),
                );
                return;
            }
            (None, None) => {
                self.error(
                    self.stage_span(i),
                    i,
                    "the stage has neither `kind` nor `command`".into(),
                    Some("add kind = \"train\" (or \"eval\") for the built-in worker, or command = [\"program\", \"arg\", …] to run any program".into()),
                );
                return;
            }
            (Some(BuiltinKind::Eval), None) if stage.init.is_none() => {
                self.error(
                    self.field(i, "kind"),
                    i,
                    "an `eval` stage needs `init`: the stage whose checkpoint it evaluates".into(),
                    Some("add init = \"NAME\", naming an upstream train stage".into()),
                );
                return;
            }
            (Some(_), None) => return,
            (None, Some(command)) => command,
        };
        match command.first() {
            None => {
                self.error(
                    self.field(i, "command"),
                    i,
                    "`command` is empty".into(),
                    Some(
                        "give the program and its arguments, like [\"python\", \"train.py\"]"
                            .into(),
                    ),
                );
                return;
            }
            Some(program) if program.trim().is_empty() => {
                self.error(
                    self.item(i, "command", 0),
                    i,
                    "the program in `command` is empty".into(),
                    None,
                );
            }
            Some(_) => {}
        }
        for (j, arg) in command.iter().enumerate() {
            let span = self.item(i, "command", j);
            if arg.contains('\0') {
                self.error(
                    span.clone(),
                    i,
                    format!("`command[{j}]` contains a NUL byte"),
                    None,
                );
            }
            match placeholder::parse(arg) {
                Err(e) => self.error(
                    span,
                    i,
                    format!("`command[{j}]` {e}"),
                    Some(TEMPLATE_HELP.into()),
                ),
                Ok(pieces) => {
                    for piece in pieces {
                        match piece {
                            Piece::Placeholder(Placeholder::Input(name)) => {
                                self.check_input(i, j, name, upstream)
                            }
                            Piece::Placeholder(Placeholder::Matrix(key))
                                if !self.stage(i).matrix.contains_key(key) =>
                            {
                                let keys = self.stage(i).matrix.keys().cloned().collect::<Vec<_>>();
                                self.error(
                                    self.item(i, "command", j),
                                    i,
                                    format!("`command[{j}]` uses `{{matrix.{key}}}`, but the stage's `matrix` has no key `{key}`"),
                                    Some(if keys.is_empty() {
                                        "add a `matrix` table to the stage, like matrix = { sample = [\"a\", \"b\"] }".into()
                                    } else {
                                        format!("its keys are: {}", keys.join(", "))
                                    }),
                                );
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// `{input.NAME}` in `command[j]`: NAME must be listed in `after` (inputs are the stages
    /// the stage runs after).
    fn check_input(&mut self, i: usize, j: usize, name: &str, upstream: &[Vec<usize>]) {
        let span = self.item(i, "command", j);
        let stage = self.stage(i);
        let message = |why: &str| format!("`command[{j}]` uses `{{input.{name}}}`, but {why}");
        match self.first_index(name) {
            None => {
                let help = self.stage_help(name);
                self.error(
                    span,
                    i,
                    message(&format!("there is no stage `{name}`")),
                    Some(help),
                );
            }
            Some(_) if name == stage.name => {
                self.error(
                    span,
                    i,
                    message("that is this stage; use `{output}` for its own directory"),
                    None,
                );
            }
            Some(up) if !upstream[i].contains(&up) => {
                self.error(
                    span,
                    i,
                    message(&format!("`{name}` is not in `after`")),
                    Some(format!(
                        "add `{name}` to `after`: a stage's inputs are the stages it runs after"
                    )),
                );
            }
            Some(_) => {}
        }
    }

    pub(super) fn check_env(&mut self, i: usize) {
        // Indexed once: looking each key up in the table would take time quadratic in the
        // number of keys (a 100,000-key `env` took a minute to validate).
        let entries = self
            .node(i)
            .and_then(|n| n.get("env"))
            .map(Node::entries_by_key)
            .unwrap_or_default();
        for (key, value) in &self.stage(i).env {
            let entry = entries.get(key.as_str()).copied();
            let key_span = entry
                .and_then(|e| e.key_span.clone())
                .or_else(|| self.field(i, "env"));
            if !is_env_name(key) {
                self.error(
                    key_span,
                    i,
                    format!("`env` key `{key}` is not a valid variable name"),
                    Some(
                        "variable names use letters, digits and `_`, and do not start with a digit"
                            .into(),
                    ),
                );
            } else if key.starts_with(RESERVED_ENV_PREFIX) {
                self.error(
                    key_span,
                    i,
                    format!("`env` key `{key}` is reserved"),
                    Some(format!("the orchestrator sets the {RESERVED_ENV_PREFIX}* variables itself: choose another name")),
                );
            }
            if value.contains('\0') {
                let span = entry
                    .and_then(|e| e.node.span.clone())
                    .or_else(|| self.field(i, "env"));
                self.error(span, i, format!("`env.{key}` contains a NUL byte"), None);
            }
        }
    }

    pub(super) fn check_outputs(&mut self, i: usize) {
        for (j, output) in self.stage(i).outputs.iter().enumerate() {
            let span = self.item(i, "outputs", j);
            let path = Path::new(output);
            let problem = if output.is_empty() {
                Some("is empty")
            } else if path.has_root() {
                Some("is an absolute path")
            } else if path.components().any(|c| c == Component::ParentDir) {
                Some("leads outside the output directory (`..`)")
            } else if output.contains('\0') {
                Some("contains a NUL byte")
            } else {
                None
            };
            if let Some(problem) = problem {
                self.error(
                    span,
                    i,
                    format!("`outputs[{j}]` ({output:?}) {problem}"),
                    Some("outputs are paths relative to the stage's output directory, like \"model.safetensors\"".into()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert!(is_env_name("CUDA_VISIBLE_DEVICES"));
        assert!(is_env_name("_x1"));
        assert!(!is_env_name("1X"));
        assert!(!is_env_name("A-B"));
        assert!(!is_env_name(""));
    }
}

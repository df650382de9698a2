//! Stage fingerprints: what decides, on `--resume`, whether a finished stage is still valid.
//!
//! A stage's fingerprint is the SHA-256 of its definition as the run uses it (the stage's
//! table from the plan, defaults applied) followed by its upstream stages' fingerprints. So
//! editing a stage changes its fingerprint and that of everything downstream of it, and
//! nothing else: like a build system. Settings that govern how a stage is run but not what it
//! computes (`timeout`, `retries`; `grace` is run-wide) are left out: raising a timeout does
//! not throw away finished work.

use crate::plan::LoadedPlan;
use sha2::{Digest, Sha256};

/// One fingerprint (hex) per stage, in plan order.
pub fn stage_fingerprints(plan: &LoadedPlan) -> Vec<String> {
    let mut prints = vec![String::new(); plan.plan.stages.len()];
    for &i in &plan.order {
        let stage = plan.stage_as_run(i);
        let mut hasher = Sha256::new();
        let mut definition = serde_json::to_value(&*stage).unwrap_or_default();
        if let Some(fields) = definition.as_object_mut() {
            for how_not_what in ["timeout", "retries"] {
                fields.remove(how_not_what);
            }
        }
        hasher.update(serde_json::to_vec(&definition).unwrap_or_default());
        for &u in &plan.upstream[i] {
            hasher.update(prints[u].as_bytes());
        }
        prints[i] = protocol::checkpoint::hex(&hasher.finalize());
    }
    prints
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan_toml;
    use std::path::Path;

    fn prints(src: &str) -> Vec<String> {
        stage_fingerprints(&parse_plan_toml(src, "t.toml", Path::new("/")).unwrap())
    }

    #[test]
    fn an_edit_changes_the_stage_and_its_downstream_only() {
        let base = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\n[[stage]]\nname = \"c\"\ncommand = [\"true\"]\n";
        let edited = base.replacen(
            "name = \"a\"\ncommand = [\"true\"]",
            "name = \"a\"\ncommand = [\"false\"]",
            1,
        );
        let (p, q) = (prints(base), prints(&edited));
        assert_eq!(p, prints(base), "deterministic");
        assert_ne!(p[0], q[0]);
        assert_ne!(p[1], q[1], "downstream follows");
        assert_eq!(p[2], q[2], "unrelated stage unchanged");
    }

    #[test]
    fn timeout_and_retries_are_not_part_of_what_a_stage_computes() {
        let base = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n";
        let edited =
            "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\ntimeout = \"2h\"\nretries = 3\n";
        assert_eq!(prints(base), prints(edited));
    }
}

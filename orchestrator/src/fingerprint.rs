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
use std::sync::{Arc, OnceLock};

/// One fingerprint (hex) per stage, in plan order.
pub fn stage_fingerprints(plan: &LoadedPlan) -> Vec<String> {
    let mut prints = vec![String::new(); plan.plan.stages.len()];
    for &i in &plan.order {
        prints[i] = fingerprint(plan, i, |u| &prints[u]);
    }
    prints
}

/// Stage `i`'s fingerprint, given its upstream stages' (`upstream(u)`).
fn fingerprint<'p>(plan: &LoadedPlan, i: usize, upstream: impl Fn(usize) -> &'p str) -> String {
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
        hasher.update(upstream(u).as_bytes());
    }
    protocol::checkpoint::hex(&hasher.finalize())
}

/// The fingerprints of a plan's stages, computed on a thread of their own, in plan order,
/// while the run starts: a 100,000-instance sweep's took a tenth of a second or more, which
/// its first stage no longer waits for. The run asks for a stage's when it records the
/// stage's start, by which time it is known (the thread computes thousands while one stage
/// starts); [`Background::get`] waits for it otherwise.
#[derive(Debug, Clone)]
pub struct Background {
    prints: Arc<[OnceLock<String>]>,
}

impl Background {
    /// Starts computing `plan`'s fingerprints (on this thread, if no thread can be started).
    pub fn start(plan: Arc<LoadedPlan>) -> Background {
        let prints: Arc<[OnceLock<String>]> = (0..plan.plan.stages.len())
            .map(|_| OnceLock::new())
            .collect();
        let background = Background { prints };
        let theirs = background.clone();
        let plan_theirs = plan.clone();
        let spawned = std::thread::Builder::new()
            .name("fingerprints".into())
            .spawn(move || theirs.compute(&plan_theirs));
        if spawned.is_err() {
            background.compute(&plan);
        }
        background
    }

    fn compute(&self, plan: &LoadedPlan) {
        // Should this thread panic, every stage left gets an empty fingerprint instead of
        // leaving the run waiting for it: such a stage counts as changed on resume, and runs
        // again.
        struct Unblock<'a>(&'a [OnceLock<String>]);
        impl Drop for Unblock<'_> {
            fn drop(&mut self) {
                for print in self.0 {
                    let _ = print.set(String::new());
                }
            }
        }
        let _unblock = Unblock(&self.prints);
        for &i in &plan.order {
            let print = fingerprint(plan, i, |u| self.prints[u].get().map_or("", String::as_str));
            let _ = self.prints[i].set(print);
        }
    }

    /// Stage `i`'s fingerprint, once it is known.
    pub fn get(&self, i: usize) -> &str {
        self.prints[i].wait()
    }

    /// Every stage's, in plan order, once all are known.
    pub fn all(&self) -> Vec<String> {
        self.prints.iter().map(|p| p.wait().clone()).collect()
    }
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
    fn the_background_thread_computes_the_same_fingerprints() {
        let src = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nmatrix = { i = [1, 2, 3] }\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\n";
        let plan = parse_plan_toml(src, "t.toml", Path::new("/")).unwrap();
        let expected = stage_fingerprints(&plan);
        let background = Background::start(Arc::new(plan));
        assert_eq!(
            background.get(expected.len() - 1),
            expected[expected.len() - 1]
        );
        assert_eq!(background.all(), expected);
        assert!(expected.iter().all(|p| p.len() == 64), "{expected:?}");
    }

    #[test]
    fn timeout_and_retries_are_not_part_of_what_a_stage_computes() {
        let base = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n";
        let edited =
            "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\ntimeout = \"2h\"\nretries = 3\n";
        assert_eq!(prints(base), prints(edited));
    }
}

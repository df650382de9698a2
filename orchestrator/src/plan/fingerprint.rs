//! Stage fingerprints: what decides, on `--resume`, whether a finished stage is still valid.
//!
//! A stage's fingerprint is the SHA-256 of its definition as the run uses it (the stage's
//! table from the plan, defaults applied) followed by its upstream stages' fingerprints. So
//! editing a stage changes its fingerprint and that of everything downstream of it, and
//! nothing else: like a build system. Settings that govern how a stage is run but not what it
//! computes (`timeout`, `stall_timeout`, `rank_grace`, `retries`, `retry_on`; `grace` is run-wide) are left out: raising a timeout does
//! not throw away finished work.

use crate::plan::LoadedPlan;
use sha2::{Digest, Sha256};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// One fingerprint (hex) per stage, in plan order.
pub fn stage_fingerprints(plan: &LoadedPlan) -> Vec<String> {
    let mut digests = vec![Digest32::default(); plan.plan.stages.len()];
    for &i in &plan.order {
        digests[i] = fingerprint(plan, i, |u| digests[u]);
    }
    digests
        .iter()
        .map(|d| protocol::checkpoint::hex(d))
        .collect()
}

/// A SHA-256 digest.
type Digest32 = [u8; 32];

/// Stage `i`'s fingerprint, given its upstream stages' (`upstream(u)`), which are hashed in
/// hex (as they are written in the journal).
fn fingerprint(plan: &LoadedPlan, i: usize, upstream: impl Fn(usize) -> Digest32) -> Digest32 {
    let stage = plan.stage_as_run(i);
    let mut hasher = Sha256::new();
    let mut definition = serde_json::to_value(&*stage).unwrap_or_default();
    if let Some(fields) = definition.as_object_mut() {
        for how_not_what in [
            "timeout",
            "stall_timeout",
            "rank_grace",
            "retries",
            "retry_on",
        ] {
            fields.remove(how_not_what);
        }
    }
    hasher.update(serde_json::to_vec(&definition).unwrap_or_default());
    for &u in &plan.upstream[i] {
        hasher.update(protocol::checkpoint::hex(&upstream(u)).as_bytes());
    }
    hasher.finalize().into()
}

/// The fingerprints of a plan's stages, computed on a thread of their own, in plan order,
/// while the run starts: a 100,000-instance sweep's took a quarter of a second, which its
/// first stage no longer waits for. The run asks for a stage's when it records the stage's
/// start, by which time it is known (the thread computes thousands while one stage starts);
/// [`Background::get`] waits for it otherwise. Plans of fewer than [`Background::INLINE`]
/// stages have theirs computed at once, on the caller's thread.
///
/// Each is kept as its 32 bytes in a slot allocated beforehand (40 bytes a stage, against
/// about a hundred for a hex string on the heap), and the thread allocates nothing that
/// outlives one stage: what it allocates stays in its own allocator arena, which the run's
/// thread does not reuse.
#[derive(Debug, Clone)]
pub(crate) struct Background {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    digests: Box<[OnceLock<Digest32>]>,
    /// Taken to wait for a fingerprint, and by the thread to say that more are known.
    lock: Mutex<()>,
    known: Condvar,
}

impl Background {
    /// Plans smaller than this are fingerprinted without a thread (starting one costs more).
    pub(crate) const INLINE: usize = 256;
    /// How many fingerprints the thread computes between two wake-ups of a waiting caller.
    const BATCH: usize = 256;

    /// Starts computing `plan`'s fingerprints (on this thread for a small plan, or when no
    /// thread can be started).
    pub fn start(plan: Arc<LoadedPlan>) -> Background {
        let background = Background {
            shared: Arc::new(Shared {
                digests: (0..plan.plan.stages.len())
                    .map(|_| OnceLock::new())
                    .collect(),
                lock: Mutex::new(()),
                known: Condvar::new(),
            }),
        };
        if plan.plan.stages.len() < Self::INLINE {
            background.compute(&plan);
            return background;
        }
        let theirs = background.clone();
        let plan_theirs = plan.clone();
        let spawned = std::thread::Builder::new()
            .name("fingerprints".into())
            .spawn(move || {
                crate::process::background::yield_to_the_run();
                theirs.compute(&plan_theirs)
            });
        if spawned.is_err() {
            background.compute(&plan);
        }
        background
    }

    fn compute(&self, plan: &LoadedPlan) {
        // Whatever happens (a panic included), every stage ends up with a fingerprint and
        // waiting callers are woken: one this thread did not reach gets a zero digest, which
        // counts as changed on resume (the stage runs again).
        struct Finish<'a>(&'a Shared);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                for digest in self.0.digests.iter() {
                    let _ = digest.set(Digest32::default());
                }
                self.0.wake();
            }
        }
        let shared = &*self.shared;
        let _finish = Finish(shared);
        for (n, &i) in plan.order.iter().enumerate() {
            let digest = fingerprint(plan, i, |u| {
                shared.digests[u].get().copied().unwrap_or_default()
            });
            let _ = shared.digests[i].set(digest);
            if (n + 1) % Self::BATCH == 0 {
                shared.wake();
            }
        }
    }

    /// Stage `i`'s fingerprint (hex), once it is known.
    pub fn get(&self, i: usize) -> String {
        let shared = &*self.shared;
        if let Some(digest) = shared.digests[i].get() {
            return protocol::checkpoint::hex(digest);
        }
        let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(digest) = shared.digests[i].get() {
                return protocol::checkpoint::hex(digest);
            }
            guard = shared.known.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Every stage's, in plan order, once all are known.
    pub fn all(&self) -> Vec<String> {
        (0..self.shared.digests.len())
            .map(|i| self.get(i))
            .collect()
    }
}

impl Shared {
    /// Wakes the callers waiting for a fingerprint (taking the lock, so that one that found
    /// its fingerprint missing is already waiting).
    fn wake(&self) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.known.notify_all();
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
        // Enough instances for the thread (and more than one batch of it), chained pairs.
        let values = (0..600)
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let src = format!("[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nmatrix = {{ i = [{values}] }}\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"true\"]\nmatrix = {{ i = [{values}] }}\n");
        let plan = parse_plan_toml(&src, "t.toml", Path::new("/")).unwrap();
        assert!(plan.plan.stages.len() >= 2 * Background::INLINE);
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

    /// The fingerprints a run journals must not change from one version to the next: a
    /// resumed run compares them with the ones an earlier binary wrote (these were computed
    /// by the code before fingerprints moved to their own thread, c6d9fe9).
    #[test]
    fn fingerprints_are_the_ones_earlier_versions_wrote() {
        let src = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[[stage]]\nname = \"b\"\nafter = [\"a\"]\ncommand = [\"echo\", \"{input.a}\"]\n";
        assert_eq!(prints(src), GOLDEN);
        let plan = parse_plan_toml(src, "t.toml", Path::new("/")).unwrap();
        assert_eq!(Background::start(Arc::new(plan)).all(), GOLDEN);
    }
    const GOLDEN: [&str; 2] = [
        "f1629ed73e0fa9eb1b68a57a78ca12d71859a32ef6b6097888932108076fecb9",
        "4810c29773989abd01c43ea0f5255971ed7b6525adc9dc7b4d409cab32e497d8",
    ];
}

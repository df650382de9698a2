//! What zygotes learn: the modules that stages forked from a zygote imported themselves,
//! which the next generation of that zygote imports too, and the modules left out (their
//! import fails, starts a thread, initialises CUDA or reads a per-stage variable).
//!
//! Kept per *lineage* (an interpreter and its `preload` setting, the environment aside: a CLI
//! run's environment differs from shell to shell, and a module is re-checked by every zygote
//! that imports it) in a small JSON file of the cache directory ([`ENV_CACHE`], else
//! `$XDG_CACHE_HOME/orchestrate/zygote`, else `~/.cache/orchestrate/zygote`), so that a
//! resumed run, the next CLI run and the daemon's next run start where the last one ended.
//! Without a cache directory nothing is learned. Written whole to a temporary file and
//! renamed: two runs that learn at once may lose one's addition, never corrupt the file.

use protocol::fork::LeftOut;
use protocol::plan::Preload;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Environment variable naming the directory where what zygotes learned is kept.
pub const ENV_CACHE: &str = "ORCHESTRATE_ZYGOTE_CACHE";

/// Environment variable that turns learning off (`0`, `off`, `false`, `no`): zygotes import
/// the plan's list only.
pub const ENV_LEARN: &str = "ORCHESTRATE_ZYGOTE_LEARN";

/// The variable of a fork request naming where the forked stage writes what it imported
/// (removed from the stage's environment before its first line).
pub(super) const IMPORTS_VAR: &str = "ORCHESTRATE_ZYGOTE_IMPORTS";

/// The file of the stage directory a forked stage writes what it imported to, at its exit;
/// read (and removed) once the stage has ended.
pub(super) const IMPORTS_FILE: &str = "zygote-imports.json";

/// How many learned modules a lineage keeps at most (the modules of torch, transformers and
/// deepspeed together are about 3,000).
const MAX_LEARNED: usize = 20_000;

/// Whether zygotes learn.
pub fn enabled() -> bool {
    !matches!(
        std::env::var(ENV_LEARN).as_deref().map(str::trim),
        Ok("0" | "off" | "false" | "no")
    )
}

/// What a lineage has learned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Knowledge {
    /// The generation a zygote started now is: 1 imports the plan's list only; each
    /// generation after adds what stages of an earlier one imported.
    #[serde(default = "first_generation")]
    pub generation: u32,
    /// The modules learned, in the order stages first imported them.
    #[serde(default)]
    pub learned: Vec<String>,
    /// The modules a zygote left out, and why: never asked for again.
    #[serde(default)]
    pub left_out: Vec<LeftOut>,
}

fn first_generation() -> u32 {
    1
}

impl Knowledge {
    fn fresh() -> Self {
        Knowledge {
            generation: 1,
            ..Knowledge::default()
        }
    }
}

/// What a forked stage wrote at its exit (see the zygote's `note_imports_at_exit`).
#[derive(Debug, Deserialize)]
pub(super) struct ImportsReport {
    /// The lineage of the zygote it was forked from.
    pub lineage: String,
    /// Every module it imported that the zygote had not, in order.
    pub imported: Vec<String>,
    /// Those the zygote could import from its own `sys.path`.
    pub preloadable: Vec<String>,
}

/// Counts the additions this process made to any lineage: a zygote looks again only when it
/// changed.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// The number of additions this process made so far.
pub(super) fn changes() -> u64 {
    CHANGES.load(Ordering::Relaxed)
}

/// The lineage of a zygote of `interpreter` with `preload`: a stable 16-digit hex id.
pub(super) fn lineage(interpreter: &Path, preload: &Preload) -> String {
    // FNV-1a: stable across builds, unlike the standard library's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let text = format!(
        "{}\0{}",
        interpreter.display(),
        serde_json::to_string(preload).expect("preload serializes")
    );
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var(ENV_CACHE) {
        return Some(PathBuf::from(dir));
    }
    let base = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("orchestrate").join("zygote"))
}

fn store(lineage: &str) -> Option<PathBuf> {
    let valid = lineage.len() == 16 && lineage.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| cache_dir().map(|d| d.join(format!("{lineage}.json"))))?
}

/// The file `lineage`'s zygotes append what they do to (their imports and how long they
/// took, every failed check and restart, and why), beside what it learned: where to look
/// when a zygote is slow to become ready. None when nothing is learned.
pub(super) fn log_path(lineage: &str) -> Option<PathBuf> {
    if !enabled() {
        return None;
    }
    store(lineage).map(|path| path.with_extension("log"))
}

/// What `lineage` has learned (nothing, generation 1, when nothing is kept or learning is off).
pub(super) fn load(lineage: &str) -> Knowledge {
    if !enabled() {
        return Knowledge::fresh();
    }
    store(lineage)
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_else(Knowledge::fresh)
}

fn save(lineage: &str, knowledge: &Knowledge) {
    let Some(path) = store(lineage) else { return };
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            let partial = path.with_extension(format!("json.{}.partial", std::process::id()));
            std::fs::write(&partial, serde_json::to_vec_pretty(knowledge)?)?;
            std::fs::rename(&partial, &path)
        });
    match written {
        Ok(()) => {
            CHANGES.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => tracing::warn!(
            "cannot keep what the zygote learned in {}: {e}",
            path.display()
        ),
    }
}

/// Adds the modules of `report` that `lineage` has neither learned nor left out; the next
/// generation imports them. Returns how many were new.
pub(super) fn learn(report: &ImportsReport) -> usize {
    learn_modules(&report.lineage, &report.preloadable)
}

/// Adds those of `modules` (modules, or `module:Name` entries read ahead from a stage's
/// script) that `lineage` has neither learned nor left out: the next generation (the one after
/// the latest this process started, however many stages taught it) imports them. Returns how
/// many were new.
pub(super) fn learn_modules(lineage: &str, modules: &[String]) -> usize {
    add(lineage, modules, true)
}

/// Keeps that `lineage`'s zygotes import `modules` (what a zygote read ahead from its first
/// stage's script and imported), as learned, without a new generation: the zygote that read
/// them holds them already, and the lineage's next zygotes import them too.
pub(super) fn keep_read_ahead(lineage: &str, modules: &[String]) {
    add(lineage, modules, false);
}

/// The latest generation of each lineage this process started a zygote of.
static STARTED: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// Notes that this process started generation `generation` of `lineage`: what is learned from
/// now on is for a later one.
pub(super) fn started(lineage: &str, generation: u32) {
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    let latest = started.entry(lineage.to_string()).or_insert(generation);
    *latest = (*latest).max(generation);
}

/// The generation a zygote of `lineage` started after this addition is: the one after the
/// latest this process started (a kept one not started yet stays), else the kept one's next.
fn next_generation(lineage: &str, kept: u32) -> u32 {
    let started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    match started.get(lineage) {
        Some(latest) => kept.max(latest + 1),
        None => kept + 1,
    }
}

/// Adds `modules` to what `lineage` learned; with `new_generation`, a zygote started after it
/// is a new generation ([`next_generation`]).
fn add(lineage: &str, modules: &[String], new_generation: bool) -> usize {
    if !enabled() || modules.is_empty() || store(lineage).is_none() {
        return 0;
    }
    let mut knowledge = load(lineage);
    let known = |k: &Knowledge, name: &str| {
        k.learned.iter().any(|m| m == name) || k.left_out.iter().any(|l| within(name, &l.module))
    };
    let mut added = 0;
    for name in modules {
        if knowledge.learned.len() < MAX_LEARNED && !known(&knowledge, name) {
            knowledge.learned.push(name.clone());
            added += 1;
        }
    }
    if added > 0 {
        if new_generation {
            knowledge.generation = next_generation(lineage, knowledge.generation);
        }
        save(lineage, &knowledge);
    }
    added
}

/// Whether importing `name` (a module, or `module:Name`) imports module `package`: it is
/// `package`, one of its submodules, or an attribute of one of them.
pub(super) fn within(name: &str, package: &str) -> bool {
    name.strip_prefix(package)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with(':'))
}

/// Keeps that `lineage` leaves `left` out from now on (a zygote said why). Returns every
/// module the lineage leaves out.
pub(super) fn leave_out(lineage: &str, left: &[LeftOut]) -> Vec<LeftOut> {
    let mut knowledge = load(lineage);
    if left.is_empty() || !enabled() {
        return knowledge.left_out;
    }
    let before = knowledge.left_out.len();
    for entry in left {
        if !knowledge.left_out.iter().any(|l| l.module == entry.module) {
            tracing::info!("the zygote leaves out `{}`: {}", entry.module, entry.reason);
            knowledge.left_out.push(entry.clone());
        }
    }
    // A module under a package left out would import it again.
    knowledge
        .learned
        .retain(|m| !left.iter().any(|l| within(m, &l.module)));
    if knowledge.left_out.len() != before {
        save(lineage, &knowledge);
    }
    knowledge.left_out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_left_out_takes_its_submodules_with_it() {
        assert!(within("threader", "threader"));
        assert!(within("threader.sub", "threader"));
        assert!(!within("threaders", "threader"));
        assert!(!within("thread", "threader"));
        assert!(within("transformers:LlamaConfig", "transformers"));
        assert!(within("lazypkg.sub:Name", "lazypkg"));
        assert!(within("lazypkg:Name", "lazypkg:Name"));
        assert!(!within("lazypkg:Name", "lazypkg:Nam"));
        assert!(!within("lazypkgs:Name", "lazypkg"));
    }

    #[test]
    fn what_is_learned_is_for_the_generation_after_the_latest_started() {
        let lineage = "read-ahead-test-lineage";
        assert_eq!(
            next_generation(lineage, 2),
            3,
            "none started here: the kept one's next"
        );
        started(lineage, 1);
        assert_eq!(next_generation(lineage, 1), 2);
        assert_eq!(
            next_generation(lineage, 2),
            2,
            "generation 2 is not started yet"
        );
        started(lineage, 2);
        started(lineage, 1);
        assert_eq!(
            next_generation(lineage, 2),
            3,
            "a stage of 1 teaching after 2 started"
        );
    }

    #[test]
    fn a_lineage_is_stable_and_names_its_interpreter_and_preload() {
        let python = Path::new("/venv/bin/python");
        let auto = lineage(python, &Preload::Auto);
        assert_eq!(auto, lineage(python, &Preload::Auto));
        assert_eq!(auto.len(), 16);
        assert_ne!(
            auto,
            lineage(python, &Preload::Modules(vec!["torch".into()]))
        );
        assert_ne!(auto, lineage(Path::new("/usr/bin/python3"), &Preload::Auto));
        assert!(store("../../etc/passwd").is_none());
    }
}

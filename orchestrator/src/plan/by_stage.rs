//! Decoding a TOML plan one stage at a time, so that a long written-out plan never holds its
//! whole parsed document.
//!
//! The text is cut by [`sections::split`]; what is not a stage is decoded as one small
//! document, and every `[[stage]]` table as a document of its own, which is dropped before the
//! next is read. Each piece goes through the same decoder as the whole plan would, so a stage
//! decodes to exactly what it decodes to there; a stage written in the plainest TOML reaches
//! that decoder without a TOML document ([`plain_stage`]).
//!
//! This path answers only for plans it gets through without a single problem. At the first
//! one (a syntax or type error, a key the rest of the text also defines) it answers `None`
//! and the caller reads the plan whole, whose messages point at lines and columns; so the
//! diagnostics a user sees do not depend on which path ran.

use super::decode;
use super::diagnostic::Reporter;
use super::plain_stage;
use super::sections;
use super::toml_tree;
use protocol::plan::Plan;

/// Below this many stages the plan is read whole: its document is small anyway.
pub(crate) const MIN_STAGES: usize = 256;

/// The plan decoded stage by stage, or `None` when it has fewer than [`MIN_STAGES`] stages
/// or any piece does not decode cleanly (then the whole parse must judge and explain it).
pub(crate) fn decode(source: &str) -> Option<Plan> {
    decode_from(source, MIN_STAGES)
}

/// [`decode`] for plans of at least `min_stages` stages.
fn decode_from(source: &str, min_stages: usize) -> Option<Plan> {
    let sections = sections::split(source)?;
    if sections.stages.len() < min_stages {
        return None;
    }
    let rest: String = sections
        .rest
        .iter()
        .map(|range| &source[range.clone()])
        .collect();
    let (mut plan, rest_has_stage) = decode_piece(&rest)?;
    if rest_has_stage {
        // The rest defines `stage` itself (`stage = [...]`, dotted keys): not a layout this
        // path combines.
        return None;
    }
    plan.stages = decode_stages(
        source,
        &sections.stages,
        decoding_threads(sections.stages.len()),
    )?;
    Some(plan)
}

/// The fewest stages a decoding thread is given: below that, starting it costs more than the
/// share of the work it takes.
const STAGES_PER_THREAD: usize = 128;

/// How many threads decode a plan of `stages` stages: one per core, at most 8, each with at
/// least [`STAGES_PER_THREAD`] stages. (A plan is decoded before any stage runs, while the
/// other cores have nothing to do.)
fn decoding_threads(stages: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(8).min(stages / STAGES_PER_THREAD).max(1)
}

/// The stages at `ranges` of `source`, in order, decoded on `threads` threads (the calling
/// one among them), each taking a run of consecutive stages; `None` at the first piece that
/// does not decode cleanly, whichever thread meets it.
fn decode_stages(
    source: &str,
    ranges: &[std::ops::Range<usize>],
    threads: usize,
) -> Option<Vec<protocol::plan::Stage>> {
    let decode_run = |ranges: &[std::ops::Range<usize>]| {
        let mut stages = Vec::with_capacity(ranges.len());
        for range in ranges {
            let text = &source[range.clone()];
            // The plainest tables without a TOML parser; any other through `toml_edit`.
            let stage = match plain_stage::decode(text) {
                Some(stage) => stage,
                None => {
                    let (piece, _) = decode_piece(text)?;
                    let [stage] = <[_; 1]>::try_from(piece.stages).ok()?;
                    stage
                }
            };
            stages.push(stage);
        }
        Some(stages)
    };
    if threads <= 1 {
        return decode_run(ranges);
    }
    let per_thread = ranges.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut runs = ranges.chunks(per_thread);
        let first = runs.next().unwrap_or_default();
        let others: Vec<_> = runs
            .map(|run| scope.spawn(move || decode_run(run)))
            .collect();
        let mut stages = decode_run(first);
        for other in others {
            let decoded = other.join().ok().flatten();
            match (&mut stages, decoded) {
                (Some(stages), Some(more)) => stages.extend(more),
                _ => stages = None,
            }
        }
        stages
    })
}

/// One piece of the text through the whole plan's decoder, and whether it has a `stage` key;
/// `None` at any problem.
fn decode_piece(text: &str) -> Option<(Plan, bool)> {
    let document = toml_edit::ImDocument::parse(text).ok()?;
    let tree = toml_tree::of_document(&document);
    let has_stage = tree.get("stage").is_some();
    let mut rep = Reporter::new(text, "");
    let plan = decode::toml_plan(text, Some(document), Some(&tree), &mut rep);
    match rep.finish() {
        None => plan.map(|plan| (plan, has_stage)),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written_out(n: usize, extra: &str) -> String {
        let mut text = String::from("[run]\nname = \"long\"\nmax_parallel = 2\n");
        for i in 0..n {
            text.push_str(&format!(
                "[[stage]]\nname = \"s{i}\"\ncommand = [\"true\", \"{i}\"]\n"
            ));
            if i > 0 {
                text.push_str(&format!("after = [\"s{}\"]\n", i - 1));
            }
            text.push_str(extra);
        }
        text
    }

    fn whole(source: &str) -> Plan {
        decode_piece(source).expect("the whole plan decodes").0
    }

    #[test]
    fn stage_by_stage_decodes_to_what_the_whole_parse_does() {
        let extra = "env = { A = \"1\" }\n[stage.params]\nwhen = 1979-05-27T07:32:00Z\n\
                     nested = { list = [1, \"x\"] }\n";
        let source = written_out(MIN_STAGES + 3, extra);
        let by_stage = decode(&source).expect("decodes stage by stage");
        assert_eq!(by_stage, whole(&source));
        assert_eq!(by_stage.run.name.as_deref(), Some("long"));
        assert_eq!(
            by_stage.stages[1].params.get("when"),
            Some(&serde_json::json!("1979-05-27T07:32:00Z")),
            "date-times in params become their text, as in the whole parse"
        );
    }

    /// Every plan file in the repository, valid or not: where the stage-by-stage path answers
    /// at all, the whole parse decodes the same plan.
    #[test]
    fn every_plan_in_the_repository_decodes_the_same_either_way() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in [
            "tests/plans/valid",
            "tests/plans/invalid",
            "configs",
            "bench/gpu/plans",
        ] {
            for entry in std::fs::read_dir(root.join(dir)).expect("plan folder") {
                files.push(entry.expect("entry").path());
            }
        }
        let mut agreed = 0;
        for path in files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        {
            let source = std::fs::read_to_string(path).expect("plan text");
            let Some(by_stage) = decode_from(&source, 0) else {
                continue;
            };
            let whole = decode_piece(&source).map(|(plan, _)| plan);
            assert_eq!(Some(by_stage), whole, "{}", path.display());
            agreed += 1;
        }
        assert!(agreed >= 20, "only {agreed} plans went stage by stage");
    }

    #[test]
    fn stages_decoded_on_several_threads_keep_the_plans_order() {
        let source = written_out(MIN_STAGES + 5, "");
        let sections = sections::split(&source).unwrap();
        let one = decode_stages(&source, &sections.stages, 1).unwrap();
        for threads in [2, 3, 7] {
            let several = decode_stages(&source, &sections.stages, threads).unwrap();
            assert_eq!(several, one, "{threads} threads");
        }
        assert_eq!(one.len(), MIN_STAGES + 5);
        assert_eq!(one[MIN_STAGES + 4].name, format!("s{}", MIN_STAGES + 4));
        // A problem in any thread's run makes the whole answer `None`.
        let bad = format!("{source}[[stage]]\nname = \"x\"\nunknown_key = 1\n");
        let sections = sections::split(&bad).unwrap();
        assert_eq!(decode_stages(&bad, &sections.stages, 3), None);
        // Fewer stages than two threads' worth: decoded on the calling thread alone.
        assert_eq!(decoding_threads(2 * STAGES_PER_THREAD - 1), 1);
        assert!(decoding_threads(100_000) <= 8);
    }

    #[test]
    fn short_plans_are_left_to_the_whole_parse() {
        assert_eq!(decode(&written_out(MIN_STAGES - 1, "")), None);
    }

    #[test]
    fn any_problem_is_left_to_the_whole_parse() {
        let good = written_out(MIN_STAGES, "");
        for bad in [
            format!("{good}[[stage]]\nname = \"x\"\nunknown_key = 1\n"),
            format!("{good}[[stage]]\nname = \"x\"\ncommand = \"not a list\"\n"),
            format!("{good}[run]\nname = \"again\"\n"),
            format!("stage = []\n{good}"),
            format!("{good}[[stage]]\nname = \"x\"\nname = \"twice\"\n"),
        ] {
            assert_eq!(
                decode(&bad),
                None,
                "{}",
                &bad[good.len().saturating_sub(10)..]
            );
        }
    }
}

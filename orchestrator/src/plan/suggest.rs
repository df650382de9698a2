//! "Did you mean …?": the closest known name to a misspelt one.

/// Edit distance between two strings, counting an insertion, a deletion, a substitution or a
/// swap of two neighbouring characters as one edit (optimal string alignment, from `strsim`).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    strsim::osa_distance(a, b)
}

/// The candidate closest to `wrong`, if one is close enough to be a plausible typo: a
/// case-insensitive match, or one within about a third of the name's length in edits.
/// Ties go to the earlier candidate.
pub(crate) fn closest<'a, I>(wrong: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let wrong_len = wrong.chars().count();
    let limit = (wrong_len.max(3) / 3).max(1);
    let lower = wrong.to_lowercase();
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        // Lengths further apart than the limit cannot be within it.
        if candidate == wrong || candidate.chars().count().abs_diff(wrong_len) > limit {
            continue;
        }
        let distance = if candidate.to_lowercase() == lower {
            0
        } else {
            edit_distance(&lower, &candidate.to_lowercase())
        };
        if distance <= limit && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, name)| name)
}

/// Names as a comma-separated list, cut short after `max` with a count of the rest.
pub(crate) fn list(names: &[&str], max: usize) -> String {
    let mut out = names[..names.len().min(max)].join(", ");
    if names.len() > max {
        out.push_str(&format!(" and {} more", names.len() - max));
    }
    out
}

/// `did you mean `x`? ` when there is a close candidate, then `{what}: a, b, c`.
pub(crate) fn help(wrong: &str, candidates: &[&str], what: &str) -> String {
    help_maybe_guessing(wrong, candidates, what, true)
}

/// [`help`], looking for a close candidate only if `guess`.
pub(crate) fn help_maybe_guessing(
    wrong: &str,
    candidates: &[&str],
    what: &str,
    guess: bool,
) -> String {
    let listed = list(candidates, 12);
    let guessed = if guess {
        closest(wrong, candidates.iter().copied())
    } else {
        None
    };
    match guessed {
        Some(name) => format!("did you mean `{name}`? {what}: {listed}"),
        None => format!("{what}: {listed}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            edit_distance("pretrian", "pretrain"),
            1,
            "a swap is one edit"
        );
        assert_eq!(edit_distance("sft", "sfts"), 1);
        assert_eq!(edit_distance("évál", "eval"), 2);
    }

    #[test]
    fn suggests_plausible_typos_only() {
        let stages = ["pretrain", "sft", "eval", "eval-pretrain"];
        assert_eq!(closest("pretrian", stages), Some("pretrain"));
        assert_eq!(closest("Pretrain", stages), Some("pretrain"));
        assert_eq!(closest("sf", stages), Some("sft"));
        assert_eq!(closest("evl", stages), Some("eval"));
        assert_eq!(closest("eval-pretrian", stages), Some("eval-pretrain"));
        assert_eq!(closest("zzz", stages), None);
        assert_eq!(closest("finetune", stages), None);
        assert_eq!(closest("", stages), None);
        assert_eq!(closest("x", std::iter::empty()), None);
    }

    #[test]
    fn prefers_the_nearest_then_the_first() {
        assert_eq!(closest("stepz", ["steps", "step"]), Some("steps"));
        assert_eq!(closest("ab", ["ax", "ay"]), Some("ax"));
    }

    #[test]
    fn lists_are_cut_short() {
        assert_eq!(list(&["a", "b", "c"], 5), "a, b, c");
        assert_eq!(list(&["a", "b", "c"], 2), "a, b and 1 more");
        assert_eq!(
            help("pretrian", &["pretrain", "sft", "eval"], "stages are"),
            "did you mean `pretrain`? stages are: pretrain, sft, eval"
        );
    }
}

//! The fixture plans under `tests/plans/`, and what each invalid one expects.
//!
//! An invalid fixture's first line is `# expect: TEXT`, a part of the message the plan must be
//! refused with; its second line may be `# at: LINE:COL`, where that message must point. Both
//! the library's fixture test and `orchestrate validate`'s read them through here.

use std::path::{Path, PathBuf};

/// The `.toml` and `.json` plans under `tests/plans/<kind>` (`valid` or `invalid`), sorted.
pub fn plans(kind: &str) -> Vec<PathBuf> {
    let dir = super::repo_root().join("tests/plans").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("toml" | "json")
            )
        })
        .collect();
    files.sort();
    files
}

/// What an invalid fixture expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// Text the refusal must contain.
    pub message: String,
    /// Line and column (1-based) the message must point at, when the fixture says.
    pub at: Option<(usize, usize)>,
}

/// Reads the expectation of the fixture at `path`; panics, naming the file, when its first
/// line is not `# expect: …` or its `# at:` line is malformed.
pub fn expectation(path: &Path) -> Expectation {
    let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    parse(&text).unwrap_or_else(|why| panic!("{}: {why}", path.display()))
}

fn parse(text: &str) -> Result<Expectation, String> {
    let mut lines = text.lines();
    let message = lines
        .next()
        .and_then(|l| l.strip_prefix("# expect: "))
        .ok_or("the first line must be `# expect: …`")?
        .trim()
        .to_string();
    let at = match lines.next().and_then(|l| l.strip_prefix("# at: ")) {
        None => None,
        Some(pos) => {
            let bad = || format!("`# at: {pos}` is not `# at: LINE:COL`");
            let (line, col) = pos.trim().split_once(':').ok_or_else(bad)?;
            Some((
                line.parse().map_err(|_| bad())?,
                col.parse().map_err(|_| bad())?,
            ))
        }
    };
    Ok(Expectation { message, at })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_message_and_the_position() {
        assert_eq!(
            parse("# expect: unknown key `x`\n# at: 3:1\nx = 1\n"),
            Ok(Expectation {
                message: "unknown key `x`".into(),
                at: Some((3, 1))
            })
        );
        assert_eq!(parse("# expect: m\nx = 1\n").unwrap().at, None);
        assert!(parse("x = 1\n").is_err());
        assert!(parse("# expect: m\n# at: 3\n").is_err());
    }
}

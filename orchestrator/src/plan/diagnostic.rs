//! What a refused plan reports: one [`Diagnostic`] per problem, rendered like a compiler error.

use std::fmt;
use std::ops::Range;

/// One problem found in a plan, with where it is and, when there is one, how to fix it.
///
/// Rendered (by `Display`) as `FILE:LINE:COL: error: stage `NAME`: MESSAGE`, followed by a
/// `  help: …` line when `help` is set. Parts that are unknown are left out: a diagnostic
/// without a line renders as `FILE: error: …`, one without a source name as `error: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The plan's name as the user gave it (a path, or a label such as `<submitted>`); empty
    /// when the message itself names the file (a plan that cannot be read).
    pub source_name: String,
    /// 1-based line of the offending text, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters) of the offending text, when known.
    pub column: Option<usize>,
    /// The stage the problem belongs to, when it belongs to one that has a name.
    pub stage: Option<String>,
    /// What is wrong, in one line, without the stage prefix.
    pub message: String,
    /// How to fix it, when there is something useful to say.
    pub help: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.source_name.is_empty() {
            f.write_str(&self.source_name)?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
                if let Some(column) = self.column {
                    write!(f, ":{column}")?;
                }
            }
            f.write_str(": ")?;
        }
        f.write_str("error: ")?;
        if let Some(stage) = &self.stage {
            write!(f, "stage `{stage}`: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(help) = &self.help {
            write!(f, "\n  help: {help}")?;
        }
        Ok(())
    }
}

/// Why a plan was refused: every problem found (at least one).
///
/// Syntax and type errors stop decoding, so there is one of those at most; the semantic checks
/// that follow a successful decoding report everything they find, in source order.
#[derive(Debug, Clone)]
pub struct PlanError {
    /// The problems, in the order they appear in the plan.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanError {}

/// Turns byte offsets of a source text into 1-based line and character columns, each in time
/// independent of the text's length: a plan of 100,000 problems on one line (a JSON plan
/// written without newlines) is not counted through 100,000 times.
pub(crate) struct LineIndex<'a> {
    source: &'a str,
    line_starts: Vec<usize>,
    /// The number of characters before each multiple of [`CHARS_EVERY`] bytes.
    chars_before: Vec<usize>,
}

/// How many bytes apart the character counts of a [`LineIndex`] are kept.
const CHARS_EVERY: usize = 64;

/// Whether `byte` begins a UTF-8 character (is not a continuation byte).
fn starts_char(byte: &u8) -> bool {
    byte & 0xC0 != 0x80
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(source: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        let mut chars_before = Vec::with_capacity(source.len() / CHARS_EVERY + 1);
        let mut count = 0;
        for block in source.as_bytes().chunks(CHARS_EVERY) {
            chars_before.push(count);
            count += block.iter().filter(|b| starts_char(b)).count();
        }
        LineIndex {
            source,
            line_starts,
            chars_before,
        }
    }

    /// The number of characters before byte `offset` (a character boundary).
    fn chars_to(&self, offset: usize) -> usize {
        let block = offset / CHARS_EVERY;
        let before = self.chars_before.get(block).copied().unwrap_or(0);
        let rest = &self.source.as_bytes()[block * CHARS_EVERY..offset];
        before + rest.iter().filter(|b| starts_char(b)).count()
    }

    /// Line and column of `offset` (clamped into the text).
    pub(crate) fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.source.len());
        while !self.source.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let start = self.line_starts[line - 1];
        let column = self.chars_to(offset) - self.chars_to(start) + 1;
        (line, column)
    }

    /// Byte offset of a 1-based line and 1-based byte column (as serde_json counts them).
    pub(crate) fn offset_of(&self, line: usize, byte_column: usize) -> Option<usize> {
        let start = *self.line_starts.get(line.checked_sub(1)?)?;
        Some((start + byte_column.saturating_sub(1)).min(self.source.len()))
    }
}

/// Collects the diagnostics of one plan, turning byte spans into positions.
pub(crate) struct Reporter<'a> {
    source_name: &'a str,
    source: &'a str,
    /// Built at the first position asked for: a plan with no problem never needs it.
    index: std::cell::OnceCell<LineIndex<'a>>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(source: &'a str, source_name: &'a str) -> Self {
        Reporter {
            source_name,
            source,
            index: std::cell::OnceCell::new(),
            diagnostics: Vec::new(),
        }
    }

    pub(crate) fn index(&self) -> &LineIndex<'a> {
        self.index.get_or_init(|| LineIndex::new(self.source))
    }

    /// Records a problem at `span` (a byte range of the source), if known.
    pub(crate) fn error(
        &mut self,
        span: Option<Range<usize>>,
        stage: Option<&str>,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        let (line, column) = match span {
            Some(span) => {
                let (line, column) = self.index().position(span.start);
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        self.diagnostics.push(Diagnostic {
            source_name: self.source_name.to_string(),
            line,
            column,
            stage: stage.map(str::to_string),
            message: message.into(),
            help,
        });
    }

    /// The source text of a span, if it is one.
    pub(crate) fn text(&self, span: &Range<usize>) -> Option<&'a str> {
        self.source.get(span.clone())
    }

    /// The line of a byte offset, for messages that refer to another place.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.index().position(offset).0
    }

    /// The collected problems in source order, or `None` if there were none.
    pub(crate) fn finish(mut self) -> Option<PlanError> {
        if self.diagnostics.is_empty() {
            return None;
        }
        self.diagnostics
            .sort_by_key(|d| (d.line.unwrap_or(0), d.column.unwrap_or(0)));
        Some(PlanError {
            diagnostics: self.diagnostics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let index = LineIndex::new("ab\néé = 1\n");
        assert_eq!(index.position(0), (1, 1));
        assert_eq!(index.position(2), (1, 3));
        assert_eq!(index.position(3), (2, 1));
        assert_eq!(index.position(7), (2, 3));
        assert_eq!(index.position(6), (2, 2), "inside a character: its start");
        assert_eq!(index.position(999), (3, 1));
        assert_eq!(index.offset_of(2, 5), Some(7));
        assert_eq!(index.offset_of(0, 1), None);
    }

    #[test]
    fn columns_count_characters_across_the_kept_counts() {
        let line = "é".repeat(CHARS_EVERY) + "x";
        let source = format!("ab\n{line}\n");
        let index = LineIndex::new(&source);
        let x = source.find('x').unwrap();
        assert_eq!(index.position(x), (2, CHARS_EVERY + 1));
        assert_eq!(index.position(x + 1), (2, CHARS_EVERY + 2));
        assert_eq!(
            index.position(x - 1),
            (2, CHARS_EVERY),
            "inside a character: its start"
        );
        assert_eq!(index.position(source.len()), (3, 1));
    }

    #[test]
    fn renders_like_a_compiler() {
        let d = Diagnostic {
            source_name: "plan.toml".into(),
            line: Some(12),
            column: Some(8),
            stage: Some("sft".into()),
            message: "`after` names `pretrian`, which is not a stage".into(),
            help: Some("did you mean `pretrain`?".into()),
        };
        assert_eq!(
            d.to_string(),
            "plan.toml:12:8: error: stage `sft`: `after` names `pretrian`, which is not a stage\n  help: did you mean `pretrain`?"
        );
        let d = Diagnostic {
            source_name: String::new(),
            line: None,
            column: None,
            stage: None,
            message: "cannot read plan `x.toml`: No such file or directory".into(),
            help: None,
        };
        assert_eq!(
            d.to_string(),
            "error: cannot read plan `x.toml`: No such file or directory"
        );
    }
}

//! The top-level sections of a TOML plan's text, found by a light scan without parsing it.
//!
//! A long written-out plan is thousands of `[[stage]]` tables. Parsing the whole text into one
//! document holds every key, value and span of it at once (about 2.8 KiB per three-line stage
//! with `toml_edit`), which is most of what loading such a plan costs in memory. Split at its
//! table headers, the plan can be decoded one stage at a time instead
//! (see [`by_stage`](super::by_stage)).
//!
//! The scan knows just enough TOML to find header lines: strings (basic, literal and their
//! multi-line forms, with escapes), comments, and brackets of values that span lines, so that
//! a `[` at the start of a line inside an array or a string is not taken for a header. Where
//! the text is anything it does not fully understand, [`split`] answers `None` and the caller
//! parses the plan whole, as before; it never guesses.

use std::ops::Range;

/// A TOML plan's text cut into its stages and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sections {
    /// The byte ranges of the text that are not stages: what comes before the first header and
    /// every table whose header is not under `stage`, in order.
    pub rest: Vec<Range<usize>>,
    /// One byte range per `[[stage]]` table, in order: its header, its keys, and the
    /// `[stage.…]` tables that directly follow it.
    pub stages: Vec<Range<usize>>,
}

/// What a header line names, as far as splitting by stage needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    /// `[[stage]]`: a new stage.
    NewStage,
    /// `[stage.…]` or `[[stage.…]]`: a table of the stage above.
    InStage,
    /// Any other table.
    Other,
}

/// Cuts `source` into its stages and the rest, or `None` when the text is not laid out as
/// `[[stage]]` tables this scan can be sure of (a string it cannot follow, a quoted first key
/// in a header, `[stage]` with single brackets, a `[stage.…]` table that does not follow its
/// stage). The pieces cover the text exactly once.
pub(crate) fn split(source: &str) -> Option<Sections> {
    let mut sections = Sections {
        rest: Vec::new(),
        stages: Vec::new(),
    };
    let mut open_start = 0;
    let mut open_kind = Header::Other;
    let mut scan = Scan::new(source);
    while let Some((start, header)) = scan.next_header()? {
        match header {
            Header::InStage if open_kind != Header::NewStage => return None,
            Header::InStage => continue,
            Header::NewStage | Header::Other => {
                close(&mut sections, open_kind, open_start..start);
                open_start = start;
                open_kind = header;
            }
        }
    }
    close(&mut sections, open_kind, open_start..source.len());
    Some(sections)
}

fn close(sections: &mut Sections, kind: Header, range: Range<usize>) {
    if range.is_empty() {
        return;
    }
    match kind {
        Header::NewStage => sections.stages.push(range),
        _ => sections.rest.push(range),
    }
}

/// A cursor over the text that skips strings, comments and bracketed values.
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
    /// How many `[` or `{` of values are open.
    depth: usize,
}

impl<'a> Scan<'a> {
    fn new(source: &'a str) -> Self {
        Scan {
            text: source.as_bytes(),
            at: 0,
            depth: 0,
        }
    }

    /// The next header line: its start and what it names; `Some(None)` at the end of the text,
    /// `None` where the text is not something this scan follows.
    fn next_header(&mut self) -> Option<Option<(usize, Header)>> {
        while self.at < self.text.len() {
            let line_start = self.at;
            self.skip_blanks();
            if self.depth == 0 && self.peek(0) == Some(b'[') {
                let header = self.header()?;
                return Some(Some((line_start, header)));
            }
            self.rest_of_line()?;
        }
        Some(None)
    }

    /// Reads a header line from its `[` to the end of the line.
    fn header(&mut self) -> Option<Header> {
        let double = self.peek(1) == Some(b'[');
        self.at += if double { 2 } else { 1 };
        let name_start = self.at;
        loop {
            match self.peek(0)? {
                b']' => break,
                b'"' | b'\'' => self.short_string()?,
                b'\n' | b'#' | b'[' => return None,
                _ => self.at += 1,
            }
        }
        let name = std::str::from_utf8(&self.text[name_start..self.at]).ok()?;
        if double {
            (self.peek(1)? == b']').then_some(())?;
            self.at += 2;
        } else {
            self.at += 1;
        }
        self.rest_of_line()?;
        classify(name, double)
    }

    /// Skips to the start of the next line, following strings and brackets on the way (a
    /// multi-line string or value may take the scan over several lines).
    fn rest_of_line(&mut self) -> Option<()> {
        while let Some(byte) = self.peek(0) {
            match byte {
                b'\n' => {
                    self.at += 1;
                    return Some(());
                }
                b'#' => self.skip_comment(),
                b'"' if self.starts_with(b"\"\"\"") => self.long_string(b"\"\"\"", true)?,
                b'\'' if self.starts_with(b"'''") => self.long_string(b"'''", false)?,
                b'"' | b'\'' => self.short_string()?,
                b'[' | b'{' => {
                    self.depth += 1;
                    self.at += 1;
                }
                b']' | b'}' => {
                    self.depth = self.depth.checked_sub(1)?;
                    self.at += 1;
                }
                _ => self.at += 1,
            }
        }
        Some(())
    }

    /// A one-line string from its opening quote to just past its closing one.
    fn short_string(&mut self) -> Option<()> {
        let quote = self.peek(0)?;
        let escapes = quote == b'"';
        self.at += 1;
        loop {
            match self.peek(0)? {
                b'\n' => return None,
                b'\\' if escapes => self.at += 2,
                byte if byte == quote => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    /// A multi-line string from its opening delimiter to just past its closing one (which may
    /// be followed by up to two more quotes that belong to the string).
    fn long_string(&mut self, delimiter: &[u8], escapes: bool) -> Option<()> {
        self.at += delimiter.len();
        loop {
            if escapes && self.peek(0)? == b'\\' {
                self.at += 2;
            } else if self.starts_with(delimiter) {
                self.at += delimiter.len();
                while self.peek(0) == Some(delimiter[0]) {
                    self.at += 1;
                }
                return Some(());
            } else {
                self.peek(0)?;
                self.at += 1;
            }
        }
    }

    fn skip_comment(&mut self) {
        while self.peek(0).is_some_and(|b| b != b'\n') {
            self.at += 1;
        }
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(0), Some(b' ' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }

    fn peek(&self, ahead: usize) -> Option<u8> {
        self.text.get(self.at + ahead).copied()
    }

    fn starts_with(&self, bytes: &[u8]) -> bool {
        self.text[self.at..].starts_with(bytes)
    }
}

/// What a header's name (between its brackets) says, or `None` for a quoted first key or
/// `[stage]` with single brackets, which the whole parse must judge.
fn classify(name: &str, double: bool) -> Option<Header> {
    let first = name.split('.').next().unwrap_or("").trim();
    if first.starts_with(['"', '\'']) {
        return None;
    }
    if first != "stage" {
        return Some(Header::Other);
    }
    let rest = name.trim_start().strip_prefix("stage")?.trim();
    match (rest.is_empty(), double) {
        (true, true) => Some(Header::NewStage),
        (true, false) => None,
        (false, _) => Some(Header::InStage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts<'a>(source: &'a str, ranges: &[Range<usize>]) -> Vec<&'a str> {
        ranges.iter().map(|r| &source[r.clone()]).collect()
    }

    #[test]
    fn stages_and_the_rest_cover_the_text_in_order() {
        let source =
            "# plan\n[run]\nname = \"x\"\n[[stage]]\nname = \"a\"\n[stage.params]\nk = 1\n\
                      [[stage]]\nname = \"b\"\n[defaults]\nx = 1\n[[stage]]\nname = \"c\"\n";
        let sections = split(source).expect("splits");
        assert_eq!(
            texts(source, &sections.stages),
            [
                "[[stage]]\nname = \"a\"\n[stage.params]\nk = 1\n",
                "[[stage]]\nname = \"b\"\n",
                "[[stage]]\nname = \"c\"\n",
            ]
        );
        assert_eq!(
            texts(source, &sections.rest),
            ["# plan\n", "[run]\nname = \"x\"\n", "[defaults]\nx = 1\n"]
        );
    }

    #[test]
    fn brackets_inside_strings_arrays_and_comments_are_not_headers() {
        let source = "[[stage]]\nname = \"a\"\ncommand = [\n  \"x\",\n[\"nested\"],\n]\n\
                      note = \"\"\"\n[[stage]]\n\"\"\"\nlit = '''\n[run]'''\n# [[stage]]\n\
                      esc = \"\\\"[[stage]]\"\n[[stage]]\nname = \"b\"\n";
        let sections = split(source).expect("splits");
        assert_eq!(
            sections.stages.len(),
            2,
            "{:?}",
            texts(source, &sections.stages)
        );
        assert!(texts(source, &sections.stages)[1].starts_with("[[stage]]\nname = \"b\""));
        assert!(sections.rest.is_empty());
    }

    #[test]
    fn spaced_and_quoted_headers() {
        let source = "[[ stage ]]\nname = \"a\"\n[ stage.params.\"a.b\" ]\nk = 1\n";
        let sections = split(source).expect("splits");
        assert_eq!(texts(source, &sections.stages), [source]);
        assert_eq!(split("[\"stage\"]\nx = 1\n"), None);
    }

    #[test]
    fn what_the_scan_cannot_be_sure_of_is_left_to_the_whole_parse() {
        for source in [
            "[stage]\nname = \"a\"\n",
            "[run]\n[stage.params]\nk = 1\n",
            "[[stage]]\nname = \"unterminated\n",
            "[[stage]]\nx = \"\"\"never closed\n",
            "[[stage]\n",
            "[[stage]]\nx = ]\n",
        ] {
            assert_eq!(split(source), None, "{source:?}");
        }
    }

    #[test]
    fn a_stages_own_sub_tables_after_another_table_are_refused() {
        let source = "[[stage]]\nname = \"a\"\n[run]\n[stage.params]\nk = 1\n";
        assert_eq!(split(source), None);
    }

    #[test]
    fn a_plan_without_headers_is_all_rest() {
        let source = "stage = [{ name = \"a\", command = [\"true\"] }]\n";
        let sections = split(source).expect("splits");
        assert!(sections.stages.is_empty());
        assert_eq!(texts(source, &sections.rest), [source]);
    }
}

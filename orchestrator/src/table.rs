//! Plain-text tables for the terminal: columns padded to their widest cell, and a run's
//! status in its colour.

use protocol::status::{RunStatus, Tone};

/// The width of a column, in characters: that of its widest cell or of its header, whichever
/// is wider, so that `{:<width$}` lines every row of it up (names may hold non-ASCII text).
pub fn column_width<'a>(header: &str, cells: impl IntoIterator<Item = &'a str>) -> usize {
    cells
        .into_iter()
        .map(|c| c.chars().count())
        .fold(header.chars().count(), usize::max)
}

/// Whether text for a terminal gets colour: `CLICOLOR_FORCE` (not `0`) forces it, `NO_COLOR`
/// refuses it, else only when the stream is a terminal.
pub fn colour_wanted(is_terminal: bool) -> bool {
    if std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| v != "0") {
        return true;
    }
    if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
        return false;
    }
    is_terminal
}

/// `text` in `tone`'s colour (green, amber, red; nothing for neutral) when `colour` is on.
pub fn paint(tone: Tone, text: &str, colour: bool) -> String {
    let code = match tone {
        Tone::Good => "32",
        Tone::Warn => "33",
        Tone::Bad => "31",
        Tone::Neutral => return text.to_string(),
    };
    match colour {
        true => format!("\x1b[1;{code}m{text}\x1b[0m"),
        false => text.to_string(),
    }
}

/// The status a summary line `run <status label> …` names, if it is one.
pub fn status_of_line(line: &str) -> Option<RunStatus> {
    let rest = line.strip_prefix("run ")?;
    // The longest label first: "succeeded with leaked GPU memory" before "succeeded".
    let mut all: Vec<RunStatus> = RunStatus::ALL.to_vec();
    all.sort_by_key(|s| std::cmp::Reverse(s.label().len()));
    all.into_iter().find(|s| {
        rest.strip_prefix(s.label())
            .is_some_and(|after| after.is_empty() || after.starts_with([' ', ':', ',']))
    })
}

/// A run's text with every `run <status> …` line in its status's colour (when `colour`).
pub fn paint_status_lines(text: &str, colour: bool) -> String {
    if !colour {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        match status_of_line(body) {
            Some(status) => {
                out.push_str(&paint(status.tone(), body, true));
                out.push_str(end);
            }
            None => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_with_leaked_memory_is_amber_and_a_clean_one_green() {
        let text =
            "stage  status\nrun succeeded with leaked GPU memory: `a` left 1024 MiB on GPU-0\n";
        let painted = paint_status_lines(text, true);
        assert!(painted.starts_with("stage  status\n"), "{painted:?}");
        assert!(
            painted.contains("\x1b[1;33mrun succeeded with leaked GPU memory: `a`"),
            "{painted:?}"
        );
        let clean = paint_status_lines("run succeeded in 1.0s (r)\n", true);
        assert_eq!(clean, "\x1b[1;32mrun succeeded in 1.0s (r)\x1b[0m\n");
        assert_eq!(paint_status_lines(text, false), text);
        assert_eq!(status_of_line("run succeededx"), None);
        assert_eq!(status_of_line("run leaked in 2s"), Some(RunStatus::Leaked));
    }

    #[test]
    fn the_widest_cell_or_the_header_in_characters() {
        assert_eq!(column_width("stage", ["a", "pretrain"]), 8);
        assert_eq!(column_width("stage", ["a"]), 5);
        assert_eq!(column_width("id", []), 2);
        assert_eq!(column_width("x", ["étape"]), 5);
    }
}

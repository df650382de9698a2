//! The placeholders a command stage's argv may hold, and their expansion.
//!
//! In each argument, `{output}` stands for the stage's output directory, `{input.NAME}` for the
//! output directory of upstream stage `NAME`, `{run_dir}` for the run directory and `{stage}` for
//! the stage's name, `{master_port}` for the attempt's rendezvous port. `{{` and `}}` stand for
//! literal braces; any other brace is an error. (`crate::attempt::contract::expand` does the
//! expansion at run time; this is the strict reading that validation applies first.)

use std::fmt;

/// One piece of a command argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text copied as is (with `{{`/`}}` already turned into single braces).
    Text(String),
    /// A placeholder to replace.
    Placeholder(Placeholder<'a>),
}

/// A placeholder of a command argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder<'a> {
    /// `{output}`: the stage's output directory.
    Output,
    /// `{input.NAME}`: upstream stage `NAME`'s output directory.
    Input(&'a str),
    /// `{run_dir}`: the run directory.
    RunDir,
    /// `{stage}`: the stage's name.
    Stage,
    /// `{matrix.KEY}`: this instance's value of matrix key `KEY`.
    Matrix(&'a str),
    /// `{master_port}`: the attempt's rendezvous port (also in `MASTER_PORT`).
    MasterPort,
}

/// Why an argument's braces could not be read, phrased for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// `{` without a matching `}`.
    Unclosed,
    /// `}` that closes nothing (and is not doubled).
    StrayClose,
    /// `{name}` where `name` is not a known placeholder.
    Unknown(String),
    /// `{input.}`: no stage named.
    EmptyInput,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::Unclosed => f.write_str("has a `{` that is never closed"),
            TemplateError::StrayClose => f.write_str("has a `}` that closes nothing"),
            TemplateError::Unknown(name) => write!(f, "uses an unknown placeholder `{{{name}}}`"),
            TemplateError::EmptyInput => f.write_str("has `{input.}` without a stage name"),
        }
    }
}

/// The help shared by all template errors.
pub const TEMPLATE_HELP: &str = "placeholders are {output}, {input.NAME}, {run_dir}, {stage}, {master_port} and {matrix.KEY}; write {{ and }} for literal braces";

/// Splits one argument into text and placeholders.
pub fn parse(arg: &str) -> Result<Vec<Piece<'_>>, TemplateError> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find(['{', '}']) {
        text.push_str(&rest[..i]);
        let brace = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&brace) {
            text.push(char::from(brace));
            rest = &after[1..];
            continue;
        }
        if brace == b'}' {
            return Err(TemplateError::StrayClose);
        }
        let end = after.find(['{', '}']).ok_or(TemplateError::Unclosed)?;
        if after.as_bytes()[end] == b'{' {
            return Err(TemplateError::Unclosed);
        }
        let name = &after[..end];
        let placeholder = match name {
            "output" => Placeholder::Output,
            "run_dir" => Placeholder::RunDir,
            "stage" => Placeholder::Stage,
            "master_port" => Placeholder::MasterPort,
            _ => match (name.strip_prefix("input."), name.strip_prefix("matrix.")) {
                (Some(""), _) => return Err(TemplateError::EmptyInput),
                (Some(stage), _) => Placeholder::Input(stage),
                (_, Some(key)) if !key.is_empty() => Placeholder::Matrix(key),
                _ => return Err(TemplateError::Unknown(name.to_string())),
            },
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Placeholder(placeholder));
        rest = &after[end + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

impl fmt::Display for Placeholder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placeholder::Output => f.write_str("{output}"),
            Placeholder::Input(name) => write!(f, "{{input.{name}}}"),
            Placeholder::RunDir => f.write_str("{run_dir}"),
            Placeholder::Stage => f.write_str("{stage}"),
            Placeholder::Matrix(key) => write!(f, "{{matrix.{key}}}"),
            Placeholder::MasterPort => f.write_str("{master_port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_placeholders_and_escapes() {
        assert_eq!(
            parse("--out={output}/x").unwrap(),
            vec![
                Piece::Text("--out=".into()),
                Piece::Placeholder(Placeholder::Output),
                Piece::Text("/x".into())
            ]
        );
        assert_eq!(
            parse("{input.pre-train}{stage}").unwrap(),
            vec![
                Piece::Placeholder(Placeholder::Input("pre-train")),
                Piece::Placeholder(Placeholder::Stage)
            ]
        );
        assert_eq!(
            parse("{{\"a\": 1}}").unwrap(),
            vec![Piece::Text("{\"a\": 1}".into())]
        );
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn refuses_bad_braces() {
        assert_eq!(
            parse("{outptu}"),
            Err(TemplateError::Unknown("outptu".into()))
        );
        assert_eq!(parse("{output"), Err(TemplateError::Unclosed));
        assert_eq!(parse("{out{put}"), Err(TemplateError::Unclosed));
        assert_eq!(parse("a}b"), Err(TemplateError::StrayClose));
        assert_eq!(parse("{input.}"), Err(TemplateError::EmptyInput));
        assert_eq!(parse("{}"), Err(TemplateError::Unknown(String::new())));
        assert_eq!(parse("é{"), Err(TemplateError::Unclosed));
    }
}

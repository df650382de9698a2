//! Turning a decoder's type error into a plain message about the key it concerns.
//!
//! The key comes from the spanned [`Node`] tree, so the message can say "`retries` must be a
//! whole number ≥ 0, not -1" instead of "invalid value: integer `-1`, expected u32".

use super::diagnostic::Reporter;
use super::expect::{
    describe, expected_shape, label, node_text, shape_mistake, stage_of, Shape, STAGE_KEYS,
};
use super::serde_message::{classify, plain_expected, Problem};
use super::suggest;
use super::tree::{Location, Node, Seg, Value};
use std::ops::Range;

/// Reports the decoder's error `raw`, found at `span` of the source: in the plan's words when
/// the tree tells which key it concerns, else as the decoder said it.
pub(crate) fn data_error(
    raw: &str,
    span: Option<Range<usize>>,
    tree: Option<&Node>,
    rep: &mut Reporter,
) {
    let problem = classify(raw);
    let location = tree.zip(span.as_ref()).and_then(|(t, s)| t.locate(s));
    let (Some(tree), Some(location)) = (tree, location) else {
        let message = match &problem {
            Problem::WrongType {
                found: Some(found),
                expected,
            } => format!("expected {}, found {found}", plain_expected(expected)),
            _ => raw.to_string(),
        };
        rep.error(span, None, message, None);
        return;
    };
    let finding = refine(problem, location, tree, rep);
    let stage = stage_of(Some(tree), &finding.path).and_then(|(_, name)| name);
    let (message, help) = render(&finding, tree);
    rep.error(finding.point, stage, message, help);
}

/// A problem, the path of the key it is about, and where to point.
struct Finding {
    problem: Problem,
    path: Vec<Seg>,
    point: Option<Range<usize>>,
}

/// Moves the problem to the key it is really about: serde reports some mistakes from inside
/// the value that holds them, and in its own words.
fn refine(problem: Problem, location: Location, tree: &Node, rep: &Reporter) -> Finding {
    let mut path = location.path.clone();
    // Where the diagnostic points: the key or value the error is about.
    let mut point = Some(location.span.clone());
    let mut problem = problem;
    if location.on_key
        && matches!(
            problem,
            Problem::UnknownField { .. } | Problem::DuplicateField(_)
        )
    {
        path.pop();
    }
    let tree_node = |path: &[Seg]| tree.find(path);
    if let Some((container, want)) = shape_mistake(tree, &path) {
        let node = tree_node(&container);
        point = node.and_then(|n| n.span.clone()).or(point);
        problem = Problem::WrongType {
            found: node.map(|n| node_text(n, rep)),
            expected: if want == Shape::Table {
                "a map".into()
            } else {
                "a sequence".into()
            },
        };
        path = container;
    } else if let (Problem::Other(_), Some(_), false) = (&problem, describe(&path), location.on_key)
    {
        // A decoder's own wording (toml's "wanted string or table") for a value of the wrong
        // type at a key the format describes: say what the key takes instead.
        problem = Problem::WrongType {
            found: tree_node(&path).map(|n| node_text(n, rep)),
            expected: String::new(),
        };
    } else if let (Problem::WrongType { found, .. }, false) = (&mut problem, location.on_key) {
        if let Some(node) = tree_node(&path).filter(|n| {
            matches!(
                n.value,
                Value::DateTime(_) | Value::Table(_) | Value::Array(_)
            )
        }) {
            *found = Some(node_text(node, rep));
        }
    }
    // An error inside a value that should have been a scalar (`gpus = [{}]`, `kind = { x = 1 }`)
    // is about the value as a whole.
    let about_a_value = matches!(
        problem,
        Problem::WrongType { .. } | Problem::Other(_) | Problem::UnknownVariant { .. }
    );
    if about_a_value && describe(&path).is_none() {
        let scalar_parent = (1..path.len())
            .rev()
            .map(|len| &path[..len])
            .find(|p| describe(p).is_some())
            .filter(|p| expected_shape(p) != Some(Shape::Table))
            .map(<[Seg]>::to_vec);
        if let Some(parent) = scalar_parent {
            let node = tree_node(&parent);
            point = node.and_then(|n| n.span.clone()).or(point);
            problem = Problem::WrongType {
                found: node.map(|n| node_text(n, rep)),
                expected: String::new(),
            };
            path = parent;
        }
    }
    Finding {
        problem,
        path,
        point,
    }
}

/// The message and help for a finding.
fn render(finding: &Finding, tree: &Node) -> (String, Option<String>) {
    let path = &finding.path;
    let stage = stage_of(Some(tree), path);
    // Inside a stage, keys are named relative to it; a stage without a name is numbered.
    let (relative, unnamed_prefix) = match stage {
        Some((i, name)) => (
            &path[2..],
            if name.is_none() {
                format!("stage #{}: ", i + 1)
            } else {
                String::new()
            },
        ),
        None => (&path[..], String::new()),
    };
    match &finding.problem {
        Problem::UnknownField { field, expected } => {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            let place = match path.as_slice() {
                [] => " at the top level".to_string(),
                [Seg::Key(k), Seg::Index(_)] if k == "stage" => String::new(),
                _ => format!(" in `{}`", label(relative)),
            };
            let mut help = suggest::help(field, &expected, "valid keys are");
            if path.is_empty() && STAGE_KEYS.contains(&field.as_str()) {
                help = "stage keys go below a `[[stage]]` header".into();
            } else if matches!(path.as_slice(), [Seg::Key(k)] if k == "run")
                && STAGE_KEYS.contains(&field.as_str())
            {
                help = format!("{help}; if `{field}` belongs to a stage, is a `[[stage]]` header missing above it?");
            }
            (
                format!("{unnamed_prefix}unknown key `{field}`{place}"),
                Some(help),
            )
        }
        Problem::MissingField(field) => {
            let message = match stage {
                Some(_) if relative.is_empty() => {
                    format!("{unnamed_prefix}the stage has no `{field}`")
                }
                _ => format!("{unnamed_prefix}`{}` has no `{field}`", label(relative)),
            };
            let help = (field == "name")
                .then(|| "every stage needs a unique `name`, like name = \"pretrain\"".to_string());
            (message, help)
        }
        Problem::DuplicateField(field) => {
            (format!("{unnamed_prefix}`{field}` is given twice"), None)
        }
        Problem::UnknownVariant { variant, expected } => {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            let what = label(relative);
            let mut help = suggest::help(variant, &expected, "valid values are");
            if what == "kind" {
                help = format!(
                    "{}; to run any other program, give `command` instead",
                    suggest::help(variant, &expected, "built-in kinds are")
                );
            }
            (
                format!("{unnamed_prefix}`{what}` cannot be `{variant}`"),
                Some(help),
            )
        }
        Problem::WrongType { found, expected } => {
            let want = describe(path)
                .map(str::to_string)
                .unwrap_or_else(|| plain_expected(expected));
            let too_large = matches!(expected.as_str(), "u32" | "u64")
                && found.as_deref().is_some_and(|f| f.parse::<u128>().is_ok());
            let what = if relative.is_empty() {
                if path.is_empty() {
                    "the plan".to_string()
                } else {
                    "each entry of `stage`".to_string()
                }
            } else {
                format!("`{}`", label(relative))
            };
            let unnamed_prefix = if relative.is_empty() {
                ""
            } else {
                unnamed_prefix.as_str()
            };
            let message = match found {
                _ if too_large => format!(
                    "{unnamed_prefix}{what} is too large (at most {})",
                    if expected == "u32" {
                        u64::from(u32::MAX)
                    } else {
                        u64::MAX
                    }
                ),
                Some(found) => format!("{unnamed_prefix}{what} must be {want}, not {found}"),
                None => format!("{unnamed_prefix}{what} must be {want}"),
            };
            let help = match path.as_slice() {
                [Seg::Key(k)] if k == "stage" => {
                    Some("write `[[stage]]` (double brackets) before each stage".to_string())
                }
                _ => None,
            };
            (message, help)
        }
        Problem::BadDuration(text) if too_long(text) => {
            (
                format!(
                    "{unnamed_prefix}`{}` is too long: `{text}` is longer than the most a plan may give, 100 years",
                    label(relative)
                ),
                Some("write at most \"36500d\"".into()),
            )
        }
        Problem::BadDuration(text) => (
            format!(
                "{unnamed_prefix}`{}` is not a valid duration: `{text}`",
                label(relative)
            ),
            Some(
                "write a number and a unit (ms, s, m, h, d), like \"90s\", \"30m\" or \"1h30m\""
                    .into(),
            ),
        ),
        Problem::Other(raw) => (
            format!("{unnamed_prefix}`{}`: {raw}", label(relative)),
            None,
        ),
    }
}

/// Whether a refused duration is well formed but longer than a plan may give.
fn too_long(text: &str) -> bool {
    text.trim()
        .parse::<protocol::duration::HumanDuration>()
        .is_err_and(|e| e.0.contains("longer than the most"))
}

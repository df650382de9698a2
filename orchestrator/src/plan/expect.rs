//! What the plan format expects at each place of a document, in words, and how a value of
//! the document reads in a message.

use super::diagnostic::Reporter;
use super::serde_message::shorten;
use super::tree::{Node, Seg, Value};

/// Keys of a stage table, for hints about misplaced keys.
pub(crate) const STAGE_KEYS: &[&str] = &[
    "name",
    "after",
    "kind",
    "command",
    "params",
    "init",
    "timeout",
    "retries",
    "gpus",
    "env",
    "outputs",
    "nodes",
    "tasks_per_node",
    "gpus_per_task",
];

/// What the value at a plan path must be, in words; `None` for paths this module does not know.
pub(crate) fn describe(path: &[Seg]) -> Option<&'static str> {
    use Seg::{Index, Key};
    fn key(s: &Seg) -> Option<&str> {
        match s {
            Key(k) => Some(k.as_str()),
            Index(_) => None,
        }
    }
    let keys: Vec<Option<&str>> = path.iter().map(key).collect();
    let duration = "a duration such as \"90s\", \"30m\" or \"1h30m\"";
    Some(match keys.as_slice() {
        [] => "a table with `run` and `stage` keys",
        [Some("run")] => "a table",
        [Some("run"), Some(k)] => match *k {
            "name" => "a string",
            "max_parallel" => "a whole number ≥ 1",
            "grace" | "reclaim_timeout" => duration,
            "gpu_check" => "one of auto, required, off",
            "gpu_tolerance_mib" => "a whole number ≥ 0 (MiB)",
            "on_leak" => "one of fail, quarantine, warn",
            "cuda_visible_devices" => "one of index, uuid",
            "worker" => "a string (the path of the stage-worker binary)",
            _ => return None,
        },
        [Some("stage")] => "an array of tables",
        [Some("stage"), None] => "a table",
        [Some("stage"), None, Some(k)] => match *k {
            "name" => "a string",
            "after" => "a list of stage names, like [\"pretrain\"]",
            "kind" => "one of train, eval",
            "command" => {
                "a list of strings: the program and its arguments, like [\"python\", \"train.py\"]"
            }
            "params" => "a table",
            "init" => "a stage name (a string)",
            "timeout" => duration,
            "retries" | "gpus" => "a whole number ≥ 0",
            "nodes" | "tasks_per_node" | "gpus_per_task" => "a whole number ≥ 1",
            "env" => "a table of NAME = \"value\" strings",
            "outputs" => "a list of paths relative to the output directory",
            _ => return None,
        },
        [Some("stage"), None, Some(k), _] => match *k {
            "after" => "a stage name (a string)",
            "command" | "env" => "a string",
            "outputs" => "a string (a relative path)",
            _ => return None,
        },
        _ => return None,
    })
}

/// What the plan format has at `path`: a table, a list, or something else (`None`).
pub(crate) fn expected_shape(path: &[Seg]) -> Option<Shape> {
    use Seg::{Index, Key};
    let is = |seg: &Seg, name: &str| matches!(seg, Key(k) if k == name);
    match path {
        [] => Some(Shape::Table),
        [k] if is(k, "run") => Some(Shape::Table),
        [k] if is(k, "stage") => Some(Shape::List),
        [k, Index(_)] if is(k, "stage") => Some(Shape::Table),
        [k, Index(_), f] if is(k, "stage") => match f {
            Key(f) if f == "params" || f == "env" => Some(Shape::Table),
            Key(f) if f == "after" || f == "command" || f == "outputs" => Some(Shape::List),
            _ => None,
        },
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Table,
    List,
}

/// How a value of the tree reads in a message: "a table", "a list", "the string \"x\"", "3".
pub(crate) fn node_text(node: &Node, rep: &Reporter) -> String {
    match &node.value {
        Value::Table(_) => "a table".into(),
        Value::Array(_) => "a list".into(),
        Value::DateTime(_) => "a date-time".into(),
        Value::String(s) => format!("the string {}", shorten(&format!("{s:?}"))),
        Value::Other => node
            .span
            .as_ref()
            .and_then(|s| rep.text(s))
            .map(shorten)
            .unwrap_or_else(|| "a value of another type".into()),
    }
}

/// The first container on `path` whose kind is not the one the format wants there: serde
/// reports such a mistake from inside it (a list read as a table reports its second element),
/// so the message is better put at the container.
pub(crate) fn shape_mistake(tree: &Node, path: &[Seg]) -> Option<(Vec<Seg>, Shape)> {
    for len in 0..=path.len() {
        let prefix = &path[..len];
        let (Some(want), Some(node)) = (expected_shape(prefix), tree.find(prefix)) else {
            continue;
        };
        let fits = match want {
            Shape::Table => matches!(node.value, Value::Table(_)),
            Shape::List => matches!(node.value, Value::Array(_)),
        };
        if !fits {
            return Some((prefix.to_vec(), want));
        }
    }
    None
}

/// The name of a path for messages: keys joined by dots, indices in brackets.
pub(crate) fn label(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The stage a path is in: its index, and its name when the tree has one.
pub(crate) fn stage_of<'t>(
    tree: Option<&'t Node>,
    path: &[Seg],
) -> Option<(usize, Option<&'t str>)> {
    match path {
        [Seg::Key(k), Seg::Index(i), ..] if k == "stage" => {
            let name = tree
                .and_then(|t| t.find(&path[..2]))
                .and_then(|s| s.get("name"))
                .and_then(Node::as_str);
            Some((*i, name))
        }
        _ => None,
    }
}

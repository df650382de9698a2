//! Checks of a built-in stage's `params` against what `stage-worker` accepts.
//!
//! Each key is decoded on its own into [`TrainParams`] or [`EvalParams`] (whose fields all have
//! defaults), so every unknown key and every wrong type is reported, each at its own key, not
//! only the first. Values that decode are then checked for ranges the worker would refuse.

use super::diagnostic::Reporter;
use super::serde_message;
use super::suggest;
use super::tree::Node;
use protocol::plan::BuiltinKind;
use protocol::worker::{EvalParams, ModelConfig, TrainParams};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::ops::Range;

/// The `data` values that name built-in synthetic tasks; anything else is a file path.
pub const SYNTHETIC_DATA: &[&str] = &["synthetic:pretrain", "synthetic:sft"];

/// Unknown keys of one table that get a "did you mean": past these, only the list of known keys.
const MAX_GUESSES: usize = 100;

/// The accepted precisions.
const PRECISIONS: &[&str] = &["auto", "bf16", "fp32"];

/// Where a stage's `params` are, for messages.
pub(crate) struct ParamsAt<'a> {
    pub stage: Option<&'a str>,
    /// The `params` table's node, when positions are known.
    pub node: Option<&'a Node>,
    /// Where to point when a key has no position of its own (the stage's table).
    pub fallback: Option<Range<usize>>,
}

impl ParamsAt<'_> {
    /// The table at `path` under `params` (`params` itself when empty).
    fn table(&self, path: &[&str]) -> Option<&Node> {
        let mut node = self.node?;
        for p in path {
            node = node.get(p)?;
        }
        Some(node)
    }

    fn value_span(&self, path: &[&str]) -> Option<Range<usize>> {
        let mut node = self.node?;
        for p in path {
            node = node.get(p)?;
        }
        node.span.clone()
    }

    fn report(
        &self,
        rep: &mut Reporter,
        span: Option<Range<usize>>,
        message: String,
        help: Option<String>,
    ) {
        let span = span
            .or_else(|| self.node.and_then(|n| n.span.clone()))
            .or_else(|| self.fallback.clone());
        rep.error(span, self.stage, message, help);
    }
}

/// Checks the params of a built-in stage of `kind`.
pub(crate) fn check(
    kind: BuiltinKind,
    params: &Map<String, Value>,
    at: &ParamsAt,
    rep: &mut Reporter,
) {
    match kind {
        BuiltinKind::Train => {
            if check_keys::<TrainParams>(kind, params, &[], at, rep) {
                if let Ok(p) = serde_json::from_value::<TrainParams>(Value::Object(params.clone()))
                {
                    check_train(&p, params, at, rep);
                }
            }
        }
        BuiltinKind::Eval => {
            if check_keys::<EvalParams>(kind, params, &[], at, rep) {
                if let Ok(p) = serde_json::from_value::<EvalParams>(Value::Object(params.clone())) {
                    check_eval(&p, at, rep);
                }
            }
        }
    }
}

/// The keys `T` accepts, read from its default value.
fn known_keys<T: Default + Serialize>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Decodes each key of `params` alone into `T`; reports unknown keys and wrong types. True if
/// all were fine.
fn check_keys<T: DeserializeOwned + Default + Serialize>(
    kind: BuiltinKind,
    params: &Map<String, Value>,
    prefix: &[&str],
    at: &ParamsAt,
    rep: &mut Reporter,
) -> bool {
    let known = known_keys::<T>();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let mut ok = true;
    let table = std::iter::once("params")
        .chain(prefix.iter().copied())
        .collect::<Vec<_>>()
        .join(".");
    // The table's keys by name, built at the first unknown key: one pass over a table of many
    // unknown keys, not one per key.
    let keys = std::cell::OnceCell::new();
    let mut unknown = 0usize;
    for (key, value) in params {
        let path: Vec<&str> = prefix
            .iter()
            .copied()
            .chain(std::iter::once(key.as_str()))
            .collect();
        if !known.contains(&key.as_str()) {
            ok = false;
            unknown += 1;
            let article = if kind == BuiltinKind::Eval { "an" } else { "a" };
            let what = format!(
                "keys of `{table}` in {article} `{}` stage are",
                kind.as_str()
            );
            let span = keys
                .get_or_init(|| at.table(prefix).map(Node::entries_by_key))
                .as_ref()
                .and_then(|k| k.get(key.as_str()))
                .and_then(|e| e.key_span.clone());
            let guess = unknown <= MAX_GUESSES;
            at.report(
                rep,
                span,
                format!("unknown key `{key}` in `{table}`"),
                Some(suggest::help_maybe_guessing(key, &known, &what, guess)),
            );
            continue;
        }
        if key == "model" && prefix.is_empty() {
            if let Value::Object(inner) = value {
                ok &= check_keys::<ModelConfig>(kind, inner, &["model"], at, rep);
                continue;
            }
        }
        let single = Map::from_iter([(key.clone(), value.clone())]);
        if let Err(error) = serde_json::from_value::<T>(Value::Object(single)) {
            ok = false;
            let raw = error.to_string();
            let message = match serde_message::type_problem(&raw) {
                Some((want, Some(found))) => format!("`{table}.{key}` must be {want}, not {found}"),
                Some((want, None)) => format!("`{table}.{key}` must be {want}"),
                None => format!("`{table}.{key}`: {raw}"),
            };
            at.report(rep, at.value_span(&path), message, None);
        }
    }
    ok
}

fn check_train(p: &TrainParams, raw: &Map<String, Value>, at: &ParamsAt, rep: &mut Reporter) {
    check_data(&p.data, at, rep);
    check_precision(&p.precision, at, rep);
    positive(p.batch_size.into(), "batch_size", at, rep);
    positive(p.seq_len.into(), "seq_len", at, rep);
    if !(p.lr.is_finite() && p.lr > 0.0) {
        at.report(
            rep,
            at.value_span(&["lr"]),
            format!("`params.lr` must be above 0, not {}", p.lr),
            None,
        );
    }
    if !(p.weight_decay.is_finite() && p.weight_decay >= 0.0) {
        let message = format!(
            "`params.weight_decay` must be 0 or more, not {}",
            p.weight_decay
        );
        at.report(rep, at.value_span(&["weight_decay"]), message, None);
    }
    if !(p.progress_every_s.is_finite() && p.progress_every_s > 0.0) {
        let message = format!(
            "`params.progress_every_s` must be above 0, not {}",
            p.progress_every_s
        );
        at.report(rep, at.value_span(&["progress_every_s"]), message, None);
    }
    let m = &p.model;
    let mut shape_ok = true;
    for (value, key) in [
        (m.d_model, "d_model"),
        (m.n_layers, "n_layers"),
        (m.n_heads, "n_heads"),
        (m.max_seq_len, "max_seq_len"),
    ] {
        if value < 1 {
            shape_ok = false;
            let message = format!("`params.model.{key}` must be 1 or more, not {value}");
            at.report(rep, at.value_span(&["model", key]), message, None);
        }
    }
    if shape_ok && m.d_model % m.n_heads != 0 {
        let message = format!(
            "`params.model.n_heads` ({}) must divide `params.model.d_model` ({})",
            m.n_heads, m.d_model
        );
        let span = at
            .value_span(&["model", "n_heads"])
            .or_else(|| at.value_span(&["model", "d_model"]));
        at.report(rep, span, message, None);
    }
    let model_given = raw.contains_key("model");
    if shape_ok && i64::from(p.seq_len) > m.max_seq_len {
        let message = format!(
            "`params.seq_len` ({}) is longer than `params.model.max_seq_len` ({}){}",
            p.seq_len,
            m.max_seq_len,
            if model_given { "" } else { ", the default" }
        );
        at.report(rep, at.value_span(&["seq_len"]), message, None);
    }
}

fn check_eval(p: &EvalParams, at: &ParamsAt, rep: &mut Reporter) {
    check_data(&p.data, at, rep);
    check_precision(&p.precision, at, rep);
    positive(p.samples.into(), "samples", at, rep);
    positive(p.batch_size.into(), "batch_size", at, rep);
    positive(p.seq_len.into(), "seq_len", at, rep);
}

fn positive(value: u64, key: &str, at: &ParamsAt, rep: &mut Reporter) {
    if value == 0 {
        at.report(
            rep,
            at.value_span(&[key]),
            format!("`params.{key}` must be 1 or more"),
            None,
        );
    }
}

fn check_data(data: &str, at: &ParamsAt, rep: &mut Reporter) {
    if data.trim().is_empty() {
        let help = format!(
            "name a file, or one of {}",
            suggest::list(SYNTHETIC_DATA, 8)
        );
        at.report(
            rep,
            at.value_span(&["data"]),
            "`params.data` is empty".into(),
            Some(help),
        );
    } else if data.starts_with("synthetic:") && !SYNTHETIC_DATA.contains(&data) {
        at.report(
            rep,
            at.value_span(&["data"]),
            format!("`params.data` names an unknown synthetic task `{data}`"),
            Some(suggest::help(data, SYNTHETIC_DATA, "synthetic tasks are")),
        );
    }
}

fn check_precision(precision: &str, at: &ParamsAt, rep: &mut Reporter) {
    if !PRECISIONS.contains(&precision) {
        at.report(
            rep,
            at.value_span(&["precision"]),
            format!("`params.precision` cannot be `{precision}`"),
            Some(suggest::help(precision, PRECISIONS, "valid values are")),
        );
    }
}

//! The JSON form of a plan: the same checks as TOML, positions from serde_json or the spanned
//! reading of the text.

use orchestrator::plan::{parse_plan_json, parse_plan_toml, LoadedPlan, PlanError};
use std::path::Path;

fn refuse(source: &str) -> PlanError {
    match parse_plan_json(source, "plan.json", Path::new("/tmp")) {
        Ok(_) => panic!("should be refused:\n{source}"),
        Err(e) => e,
    }
}

fn load(source: &str) -> LoadedPlan {
    parse_plan_json(source, "plan.json", Path::new("/tmp")).unwrap_or_else(|e| panic!("{e}"))
}

/// 1-based line and column of the first `needle` in `source`.
fn at(source: &str, needle: &str) -> Option<(usize, usize)> {
    let offset = source.find(needle).expect("needle in source");
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    Some((line, column))
}

/// Asserts one diagnostic reads `expected` at `line:col` (`None`: no position).
fn assert_reports(source: &str, at: Option<(usize, usize)>, expected: &str) {
    let error = refuse(source);
    let rendered = error.to_string();
    let hit = error
        .diagnostics
        .iter()
        .find(|d| d.to_string().contains(expected));
    let Some(d) = hit else {
        panic!("expected `{expected}` in\n{rendered}");
    };
    assert_eq!(
        d.line.zip(d.column),
        at,
        "position of `{expected}` in\n{rendered}"
    );
}

#[test]
fn syntax_errors_have_serde_json_positions() {
    let src = "{\"stage\": [\n  {\"name\": \"a\",]\n}";
    assert_reports(src, at(src, "]"), "invalid JSON: key must be a string");
    assert_reports("", None, "the plan is empty");
    assert_reports("[1]", Some((1, 1)), "the plan must be a table");
}

#[test]
fn lists_are_not_read_as_tables() {
    // serde would read a struct from a list, field by field; the format wants tables.
    assert_reports(
        "[{}, []]",
        Some((1, 1)),
        "the plan must be a table, not a list",
    );
    let src = r#"{"stage": [["a", [], "train"]]}"#;
    assert_reports(
        src,
        at(src, "[\"a\""),
        "each entry of `stage` must be a table, not a list",
    );
    let src = r#"{"run": ["x"], "stage": [{"name": "a", "command": ["true"]}]}"#;
    assert_reports(src, at(src, "[\"x\"]"), "`run` must be a table, not a list");
    let toml = "run = [\"x\"]\n[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n";
    let error = parse_plan_toml(toml, "p.toml", Path::new("/tmp")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "p.toml:1:7: error: `run` must be a table, not a list"
    );
}

#[test]
fn type_errors_name_the_key() {
    let src = "{\"stage\": [\n  {\"name\": \"a\", \"kind\": \"train\", \"retries\": -1}\n]}";
    assert_reports(
        src,
        at(src, "-1"),
        "stage `a`: `retries` must be a whole number ≥ 0, not -1",
    );
    let src = "{\"stage\": [{\"name\": \"a\", \"kind\": \"train\", \"retry\": 1}]}";
    assert_reports(src, at(src, "\"retry\""), "stage `a`: unknown key `retry`");
    let src = "{\"stage\": [{\"kind\": \"train\"}]}";
    assert_reports(src, at(src, "{\"kind"), "stage #1: the stage has no `name`");
    let src = "{\"stage\": [{\"name\": \"a\", \"kind\": \"trian\"}]}";
    assert_reports(src, at(src, "\"trian\""), "`kind` cannot be `trian`");
    let src = "{\"stage\": [{\"name\": \"a\", \"name\": \"b\", \"kind\": \"train\"}]}";
    assert_reports(src, at(src, "\"name\": \"b\""), "`name` is given twice");
    let src = "{\"run\": {\"max_parallel\": \"4\"}, \"stage\": []}";
    assert_reports(
        src,
        at(src, "\"4\""),
        "`run.max_parallel` must be a whole number ≥ 1, not the string \"4\"",
    );
}

#[test]
fn semantic_errors_point_into_json_too() {
    let src = r#"{"stage": [
  {"name": "pretrain", "kind": "train"},
  {"name": "sft", "kind": "train", "after": ["pretrian"], "init": "pretrain",
   "params": {"stepz": 3}}
]}"#;
    let error = refuse(src);
    let text = error.to_string();
    let expect = [
        ("\"pretrian\"", "`after` names `pretrian`, which is not a stage\n  help: did you mean `pretrain`? stages are: pretrain, sft"),
        ("\"pretrain\",\n", "`init` names `pretrain`, which is not upstream"),
        ("\"stepz\"", "unknown key `stepz` in `params`"),
    ];
    for (needle, message) in expect {
        let (line, col) = at(src, needle).unwrap();
        let line = format!("plan.json:{line}:{col}: error: stage `sft`: {message}");
        assert!(text.contains(&line), "expected\n{line}\nin\n{text}");
    }
    assert_eq!(error.diagnostics.len(), 3, "{text}");
}

#[test]
fn json_and_toml_forms_load_the_same_plan() {
    let toml = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[[stage]]\nname = \"b\"\nkind = \"train\"\nafter = [\"a\"]\ninit = \"a\"\n";
    let json = r#"{"stage": [{"name": "a", "command": ["true"]}, {"name": "b", "kind": "train", "after": ["a"], "init": "a"}]}"#;
    let from_toml = parse_plan_toml(toml, "p.toml", Path::new("/tmp")).unwrap();
    let from_json = load(json);
    assert_eq!(from_toml.plan, from_json.plan);
    assert_eq!(from_json.order, vec![0, 1]);
    assert_eq!(from_json.upstream, vec![vec![], vec![0]]);
    assert_eq!(from_json.downstream, vec![vec![1], vec![]]);
    let resolved = serde_json::to_string(&from_json.plan).unwrap();
    assert_eq!(
        load(&resolved).plan,
        from_json.plan,
        "a resolved plan reloads as itself"
    );
}

#[test]
fn the_schema_describes_stages() {
    let schema = orchestrator::plan::json_schema();
    let text = schema.to_string();
    assert!(text.contains("\"stage\""), "{text}");
    assert!(text.contains("max_parallel"), "{text}");
}

#[test]
fn toml_dates_in_params_reach_the_stage_as_text() {
    let toml = "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[stage.params]\nsince = 1979-05-27\nlist = [07:32:00]\n";
    let loaded =
        parse_plan_toml(toml, "p.toml", Path::new("/tmp")).unwrap_or_else(|e| panic!("{e}"));
    let params = serde_json::Value::Object(loaded.plan.stages[0].params.clone());
    assert_eq!(
        params,
        serde_json::json!({"since": "1979-05-27", "list": ["07:32:00"]})
    );
}

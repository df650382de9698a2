//! Properties of plan loading: no input makes it panic, every refusal says something, and every
//! well-formed DAG loads with an order that respects its dependencies.

use orchestrator::plan::{load_plan, parse_plan_json, parse_plan_toml, LoadedPlan, PlanError};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use toml::Value;

const BASE: &str = "/tmp";

/// Checks what every result must satisfy: a refusal has diagnostics with messages and sane
/// positions, and renders.
fn check_result(source: &str, result: Result<LoadedPlan, PlanError>) -> Result<(), TestCaseError> {
    match result {
        Ok(loaded) => assert_order(&loaded),
        Err(error) => {
            prop_assert!(!error.diagnostics.is_empty());
            let lines = source.split('\n').count();
            for d in &error.diagnostics {
                prop_assert!(!d.message.trim().is_empty(), "empty message: {d:?}");
                if let Some(line) = d.line {
                    prop_assert!(line >= 1 && line <= lines, "line {line} of {lines}: {d:?}");
                    prop_assert!(d.column.is_some_and(|c| c >= 1), "{d:?}");
                }
            }
            prop_assert!(!error.to_string().is_empty());
            Ok(())
        }
    }
}

/// The order is a permutation with every stage after its upstreams, which match `after`.
fn assert_order(loaded: &LoadedPlan) -> Result<(), TestCaseError> {
    let n = loaded.plan.stages.len();
    let mut position = vec![usize::MAX; n];
    for (at, &stage) in loaded.order.iter().enumerate() {
        prop_assert_eq!(
            position[stage],
            usize::MAX,
            "stage {} twice in the order",
            stage
        );
        position[stage] = at;
    }
    prop_assert_eq!(loaded.order.len(), n);
    for (i, stage) in loaded.plan.stages.iter().enumerate() {
        let names: Vec<&str> = loaded.upstream[i]
            .iter()
            .map(|&u| loaded.plan.stages[u].name.as_str())
            .collect();
        prop_assert_eq!(&names, &stage.after);
        for &u in &loaded.upstream[i] {
            prop_assert!(position[u] < position[i]);
            prop_assert!(loaded.downstream[u].contains(&i));
        }
    }
    Ok(())
}

fn check_both(source: &str) -> Result<(), TestCaseError> {
    check_result(
        source,
        parse_plan_toml(source, "fuzz.toml", Path::new(BASE)),
    )?;
    check_result(
        source,
        parse_plan_json(source, "fuzz.json", Path::new(BASE)),
    )
}

/// Words that make up TOML and JSON plans, to reach past the first syntax error.
const TOKENS: &[&str] = &[
    "[[stage]]",
    "[stage]",
    "[run]",
    "[stage.params]",
    "[stage.params.model]",
    "[stage.env]",
    "name",
    "after",
    "kind",
    "command",
    "init",
    "params",
    "timeout",
    "retries",
    "gpus",
    "env",
    "outputs",
    "run",
    "max_parallel",
    "stage",
    "=",
    "=",
    "\"a\"",
    "\"b\"",
    "\"train\"",
    "\"eval\"",
    "\"0s\"",
    "\"{output}\"",
    "\"{input.a}\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    ",",
    ":",
    ".",
    "\n",
    "\n",
    "\n",
    " ",
    "1",
    "-1",
    "1.5",
    "true",
    "nan",
    "1979-05-27",
    "\"",
    "'",
    "#",
    "\"\"",
    "\"\\u0000\"",
    "é",
    "\t",
    "\"stage\"",
    "\"name\"",
];

static FILE_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Writes `bytes` to a fresh temporary file with extension `ext` and loads it.
fn load_bytes(bytes: &[u8], ext: &str) -> Result<(), TestCaseError> {
    let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("plan-props-{}-{n}.{ext}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let result = load_plan(&path);
    std::fs::remove_file(&path).ok();
    let source = String::from_utf8_lossy(bytes);
    check_result(&source, result)
}

/// Keys of the plan format and a few others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(&[
            "stage", "name", "after", "kind", "command", "init", "params", "timeout", "retries", "gpus",
            "env", "outputs", "run", "max_parallel", "model", "steps", "data", "precision", "on_leak",
            "ORCHESTRATE_X", "PATH", "1bad",
        ][..]).prop_map(String::from),
        1 => "[a-z_]{1,6}",
        1 => ".{0,4}",
    ]
}

fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(
            &[
                "a",
                "b",
                "c",
                "train",
                "eval",
                "trian",
                "0s",
                "30m",
                "5x",
                "",
                "{output}",
                "{input.a}",
                "{input.zz}",
                "{bad}",
                "{",
                "}}",
                "/abs",
                "../up",
                "synthetic:sft",
                "auto",
                "fp16",
            ][..]
        )
        .prop_map(String::from),
        ".{0,8}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..70).prop_map(Value::Integer),
        any::<i64>().prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        string_value().prop_map(Value::String),
        Just(Value::Datetime("1979-05-27T07:32:00Z".parse().unwrap())),
    ]
}

fn any_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(key(), inner, 0..5).prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

fn names() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => select(&["a", "b", "c"][..]).prop_map(|s| Value::String(s.into())),
        1 => any_value(),
    ]
}

fn strings() -> impl Strategy<Value = Value> {
    vec(string_value().prop_map(Value::String), 0..4).prop_map(Value::Array)
}

fn table_of(values: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    btree_map(key(), values, 0..4).prop_map(|m| Value::Table(m.into_iter().collect()))
}

/// A stage table whose keys are mostly the real ones, with values mostly of the right types.
fn stage_table() -> impl Strategy<Value = Value> {
    (
        option::weighted(0.95, names()),
        option::of(prop_oneof![4 => vec(names(), 0..3).prop_map(Value::Array), 1 => any_value()]),
        option::of(prop_oneof![
            4 => select(&["train", "eval", "trian"][..]).prop_map(|s| Value::String(s.into())),
            1 => any_value()
        ]),
        option::of(prop_oneof![4 => strings(), 1 => any_value()]),
        option::of(names()),
        option::of(prop_oneof![4 => table_of(leaf()), 1 => any_value()]),
        option::weighted(0.1, (key(), any_value())),
        option::weighted(
            0.5,
            (
                select(&["timeout", "retries", "gpus", "env", "outputs"][..]),
                any_value(),
            ),
        ),
        option::weighted(
            0.3,
            prop_oneof![table_of(string_value().prop_map(Value::String)), strings()],
        ),
    )
        .prop_map(
            |(name, after, kind, command, init, params, extra, other, env_or_outputs)| {
                let mut t = toml::Table::new();
                let fields = [
                    ("name", name),
                    ("after", after),
                    ("kind", kind),
                    ("command", command),
                    ("init", init),
                    ("params", params),
                ];
                for (k, v) in fields {
                    if let Some(v) = v {
                        t.insert(k.into(), v);
                    }
                }
                match env_or_outputs {
                    Some(v @ Value::Table(_)) => {
                        t.insert("env".into(), v);
                    }
                    Some(v) => {
                        t.insert("outputs".into(), v);
                    }
                    None => {}
                }
                for (k, v) in extra
                    .into_iter()
                    .chain(other.map(|(k, v)| (k.to_string(), v)))
                {
                    t.insert(k, v);
                }
                Value::Table(t)
            },
        )
}

fn document() -> impl Strategy<Value = toml::Table> {
    (
        option::weighted(
            0.3,
            prop_oneof![
                btree_map(key(), any_value(), 0..3)
                    .prop_map(|m| Value::Table(m.into_iter().collect())),
                any_value()
            ],
        ),
        option::weighted(
            0.9,
            prop_oneof![6 => vec(stage_table(), 0..5).prop_map(Value::Array), 1 => any_value()],
        ),
        option::weighted(0.1, (key(), any_value())),
    )
        .prop_map(|(run, stage, extra)| {
            let mut t = toml::Table::new();
            if let Some((k, v)) = extra {
                t.insert(k, v);
            }
            if let Some(run) = run {
                t.insert("run".into(), run);
            }
            if let Some(stage) = stage {
                t.insert("stage".into(), stage);
            }
            t
        })
}

/// A valid plan: stage `i` may run after any earlier stage; written in a shuffled order.
#[derive(Debug, Clone)]
struct Dag {
    names: Vec<String>,
    after: Vec<Vec<usize>>,
    /// 0: command, 1: train, 2: eval (only with an upstream).
    kinds: Vec<u8>,
    file_order: Vec<usize>,
}

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..14)
        .prop_flat_map(|n| {
            let edges = (0..n)
                .map(|i| vec(any::<bool>(), i).boxed())
                .collect::<Vec<_>>();
            (
                edges,
                vec(0u8..3, n),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                vec("[a-z][a-z0-9_.-]{0,5}", n),
            )
        })
        .prop_map(|(edges, kinds, file_order, stems)| {
            let n = edges.len();
            let names = (0..n).map(|i| format!("{}-{i}", stems[i])).collect();
            let after: Vec<Vec<usize>> = edges
                .iter()
                .map(|bits| {
                    bits.iter()
                        .enumerate()
                        .filter(|(_, b)| **b)
                        .map(|(j, _)| j)
                        .collect()
                })
                .collect();
            // An eval stage needs an upstream that writes a checkpoint (not another eval).
            let mut fixed: Vec<u8> = Vec::with_capacity(n);
            for (i, &k) in kinds.iter().enumerate() {
                let has_checkpoint = after[i].iter().any(|&j| fixed[j] != 2);
                fixed.push(if k == 2 && !has_checkpoint { 1 } else { k });
            }
            Dag {
                names,
                after,
                kinds: fixed,
                file_order,
            }
        })
}

fn toml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

impl Dag {
    /// The upstream a built-in stage starts from: the first that writes a checkpoint.
    fn init_of(&self, i: usize) -> Option<&str> {
        self.after[i]
            .iter()
            .find(|&&j| self.kinds[j] != 2)
            .map(|&j| self.names[j].as_str())
    }

    fn stage_names(&self, stages: &[usize]) -> Vec<String> {
        stages.iter().map(|&j| self.names[j].clone()).collect()
    }

    /// The plan as TOML, with `extra_after[i]` appended to stage i's `after`.
    fn to_toml(&self, extra_after: Option<(usize, usize)>) -> String {
        let mut out = String::from("[run]\nname = \"prop\"\n");
        for &i in &self.file_order {
            let mut after = self.stage_names(&self.after[i]);
            if let Some((stage, dep)) = extra_after {
                if stage == i {
                    after.push(self.names[dep].clone());
                }
            }
            let after: Vec<String> = after.iter().map(|a| toml_str(a)).collect();
            out += &format!(
                "\n[[stage]]\nname = {}\nafter = [{}]\n",
                toml_str(&self.names[i]),
                after.join(", ")
            );
            match self.kinds[i] {
                0 => {
                    let mut argv = vec![toml_str("cp"), toml_str("-r")];
                    argv.extend(
                        self.after[i]
                            .iter()
                            .map(|&j| toml_str(&format!("{{input.{}}}", self.names[j]))),
                    );
                    argv.push(toml_str("{output}/{stage}"));
                    out += &format!("command = [{}]\n", argv.join(", "));
                }
                k => {
                    out += &format!("kind = \"{}\"\n", if k == 1 { "train" } else { "eval" });
                    if let Some(init) = self.init_of(i) {
                        out += &format!("init = {}\n", toml_str(init));
                    }
                    out += "[stage.params]\nseed = 3\n";
                }
            }
        }
        out
    }

    fn to_json(&self) -> String {
        let stages: Vec<serde_json::Value> = self
            .file_order
            .iter()
            .map(|&i| {
                let mut stage = serde_json::json!({ "name": self.names[i], "after": self.stage_names(&self.after[i]) });
                match self.kinds[i] {
                    0 => stage["command"] = serde_json::json!(["true", "{output}"]),
                    k => {
                        stage["kind"] = serde_json::json!(if k == 1 { "train" } else { "eval" });
                        if let Some(init) = self.init_of(i) {
                            stage["init"] = serde_json::json!(init);
                        }
                    }
                }
                stage
            })
            .collect();
        serde_json::json!({ "stage": stages }).to_string()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..400)) {
        check_both(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn token_soup_never_panics(tokens in vec(select(TOKENS), 0..60)) {
        let source = tokens.join(" ");
        check_both(&source)?;
        check_both(&source.replace(" = ", ": "))?;
    }

    #[test]
    fn random_documents_never_panic_and_always_explain(doc in document()) {
        if let Ok(text) = toml::to_string(&doc) {
            check_result(&text, parse_plan_toml(&text, "doc.toml", Path::new(BASE)))?;
        }
        if let Ok(text) = serde_json::to_string(&doc) {
            check_result(&text, parse_plan_json(&text, "doc.json", Path::new(BASE)))?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn raw_files_never_panic(bytes in vec(any::<u8>(), 0..300), json in any::<bool>()) {
        load_bytes(&bytes, if json { "json" } else { "toml" })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn valid_dags_load_in_dependency_order(dag in dag()) {
        let text = dag.to_toml(None);
        let loaded = parse_plan_toml(&text, "dag.toml", Path::new(BASE))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        assert_order(&loaded)?;
        prop_assert_eq!(loaded.plan.stages.len(), dag.names.len());
        let json = dag.to_json();
        let loaded = parse_plan_json(&json, "dag.json", Path::new(BASE))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{json}")))?;
        assert_order(&loaded)?;
    }

    #[test]
    fn a_back_edge_is_reported_as_a_cycle(dag in dag()) {
        // The first edge j → i, turned around as well: i and j now wait on each other.
        let Some((i, j)) = (0..dag.names.len()).find_map(|i| dag.after[i].first().map(|&j| (i, j))) else {
            return Ok(());
        };
        let text = dag.to_toml(Some((j, i)));
        let error = parse_plan_toml(&text, "dag.toml", Path::new(BASE)).err();
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        prop_assert!(message.contains("dependency cycle"), "{}\n{}", message, text);
    }
}

#[test]
fn thousands_of_stages_load_and_are_checked_in_reasonable_time() {
    let n = 3_000;
    let mut chain = String::new();
    let mut wrong = String::new();
    for i in 0..n {
        let (after, input) = match i {
            0 => (String::new(), "x".to_string()),
            _ => (format!("\"s{}\"", i - 1), format!("{{input.s{}}}", i - 1)),
        };
        chain += &format!("[[stage]]\nname = \"s{i}\"\nafter = [{after}]\ncommand = [\"cp\", \"{input}\", \"{{output}}\"]\n");
        wrong += &format!("[[stage]]\nname = \"w{i}\"\nafter = [\"v{i}\"]\ncommand = [\"true\"]\n");
    }
    let started = std::time::Instant::now();
    let loaded =
        parse_plan_toml(&chain, "chain.toml", Path::new(BASE)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.order, (0..n).collect::<Vec<_>>());
    let error = parse_plan_toml(&wrong, "wrong.toml", Path::new(BASE)).unwrap_err();
    assert_eq!(error.diagnostics.len(), n);
    // Generous even for a debug build on a slow machine; the point is "not quadratic".
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}

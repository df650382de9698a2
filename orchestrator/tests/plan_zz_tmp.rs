#![allow(dead_code)]
use orchestrator::plan::{load_plan, parse_plan_json, parse_plan_toml, LoadedPlan, PlanError};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use toml::Value;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
include!("/tmp/body.rs");
#[test]
fn show() {
    let mut runner = TestRunner::deterministic();
    let mut counts = std::collections::BTreeMap::new();
    for n in 0..3000 {
        let doc = document().new_tree(&mut runner).unwrap().current();
        let Ok(text) = toml::to_string(&doc) else { *counts.entry("ser-fail".to_string()).or_insert(0) += 1; continue };
        match parse_plan_toml(&text, "doc.toml", Path::new(BASE)) {
            Ok(_) => *counts.entry("ok".to_string()).or_insert(0) += 1,
            Err(e) => {
                for d in &e.diagnostics {
                    let key: String = d.message.chars().take(30).collect();
                    let c = counts.entry(key).or_insert(0);
                    *c += 1;
                    if *c == 1 && n % 2 == 0 { println!("{d}\n   ---"); }
                    if d.line.is_none() && !d.message.contains("no stages") { println!("NOPOS {d}\n{text}\n=====\n"); }
                }
            }
        }
    }
    for (k, v) in counts { println!("{v:5} {k}"); }
}

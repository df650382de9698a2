//! Every plan under `tests/plans/invalid/` is refused with the message its first line expects
//! (`# expect: TEXT`), at the position its second line gives (`# at: LINE:COL`) if it has one;
//! every plan under `tests/plans/valid/` loads, with a topological order.

use e2e_tests::fixtures::{expectation, plans as fixtures};
use orchestrator::plan::{load_plan, LoadedPlan};
use std::path::Path;

#[test]
fn invalid_plans_are_refused_with_the_expected_message_and_position() {
    let files = fixtures("invalid");
    assert!(files.len() >= 30, "only {} invalid fixtures", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let expect = expectation(path);
        let rendered = match load_plan(path) {
            Ok(_) => {
                failures.push(format!("{}: loaded, but should be refused", path.display()));
                continue;
            }
            Err(error) => {
                assert!(!error.diagnostics.is_empty(), "{}", path.display());
                error.to_string()
            }
        };
        if std::env::var_os("SHOW_PLAN_ERRORS").is_some() {
            println!("{rendered}\n");
        }
        if !rendered.contains(&expect.message) {
            failures.push(format!(
                "{}: expected a message containing\n    {}\n  got\n    {}",
                path.display(),
                expect.message,
                rendered.replace('\n', "\n    ")
            ));
            continue;
        }
        if let Some((line, col)) = expect.at {
            let position = format!("{}:{line}:{col}: error: ", path.display());
            // A diagnostic is its first line and the `  help:` line under it.
            let mut blocks: Vec<String> = Vec::new();
            for line in rendered.lines() {
                match blocks.last_mut() {
                    Some(block) if line.starts_with("  ") => block.push_str(line),
                    _ => blocks.push(line.to_string()),
                }
            }
            let found = blocks
                .iter()
                .any(|b| b.starts_with(&position) && b.contains(&expect.message));
            if !found {
                failures.push(format!(
                    "{}: expected the error at {line}:{col}, got\n    {}",
                    path.display(),
                    rendered.replace('\n', "\n    ")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

fn assert_well_ordered(path: &Path, loaded: &LoadedPlan) {
    let n = loaded.plan.stages.len();
    let mut sorted = loaded.order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "{}: order is not a permutation",
        path.display()
    );
    let mut position = vec![0; n];
    for (at, &stage) in loaded.order.iter().enumerate() {
        position[stage] = at;
    }
    for (stage, ups) in loaded.upstream.iter().enumerate() {
        for &up in ups {
            assert!(
                position[up] < position[stage],
                "{}: {up} must come before {stage}",
                path.display()
            );
            assert!(
                loaded.downstream[up].contains(&stage),
                "{}: downstream of {up}",
                path.display()
            );
        }
    }
    for (i, stage) in loaded.plan.stages.iter().enumerate() {
        assert_eq!(loaded.index_of(&stage.name), Some(i));
        let named: Vec<&str> = loaded.upstream[i]
            .iter()
            .map(|&u| loaded.plan.stages[u].name.as_str())
            .collect();
        assert_eq!(
            named,
            stage.after,
            "{}: upstream of {}",
            path.display(),
            stage.name
        );
    }
    assert!(loaded.base_dir.is_absolute());
    assert!(
        loaded.base_dir.ends_with("tests/plans/valid"),
        "{}",
        loaded.base_dir.display()
    );
}

#[test]
fn valid_plans_load_in_dependency_order() {
    let files = fixtures("valid");
    assert!(files.len() >= 3);
    for path in &files {
        match load_plan(path) {
            Ok(loaded) => assert_well_ordered(path, &loaded),
            Err(e) => panic!("{} should load:\n{e}", path.display()),
        }
    }
}

#[test]
fn the_shipped_quickstart_loads_in_pipeline_order() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let quickstart =
        load_plan(&root.join("configs/quickstart.toml")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = quickstart
        .order
        .iter()
        .map(|&i| quickstart.plan.stages[i].name.as_str())
        .collect();
    assert_eq!(names, ["pretrain", "sft", "eval", "eval-pretrain"]);
}

#[test]
fn a_diamond_orders_its_sides_between_source_and_sink() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/plans/valid/diamond.toml");
    let loaded = load_plan(&path).unwrap();
    let names: Vec<&str> = loaded
        .order
        .iter()
        .map(|&i| loaded.plan.stages[i].name.as_str())
        .collect();
    assert_eq!(names, ["prepare", "train-a", "train-b", "compare"]);
    let prepare = loaded.index_of("prepare").unwrap();
    assert_eq!(loaded.downstream[prepare].len(), 2);
}

#[test]
fn a_missing_file_is_named_without_a_position() {
    let error = load_plan(Path::new("no/such/plan.toml")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "error: cannot read plan `no/such/plan.toml`: No such file or directory"
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let error = load_plan(dir).unwrap_err();
    assert!(error.to_string().contains("is a directory"), "{error}");
}

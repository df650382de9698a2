//! `orchestrate validate` on every fixture plan: invalid ones exit 2 with the expected message
//! (and position), never a panic; valid ones exit 0. Also `orchestrate schema`.

use e2e_tests::{orchestrate, repo_root};
use std::process::Command;

fn fixtures(kind: &str) -> Vec<std::path::PathBuf> {
    let dir = repo_root().join("tests/plans").join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml" || e == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn invalid_plans_exit_2_with_the_expected_message() {
    let files = fixtures("invalid");
    assert!(
        files.len() >= 25,
        "at least 25 malformed plans, found {}",
        files.len()
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("# expect: ")
                    .or_else(|| l.strip_prefix("// expect: "))
            })
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()))
            .trim()
            .to_string();
        let at = text
            .lines()
            .find_map(|l| l.strip_prefix("# at: "))
            .map(|s| s.trim().to_string());
        let out = Command::new(orchestrate())
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", file.display());
        assert!(
            stderr.contains(&expect),
            "{}: expected `{expect}` in:\n{stderr}",
            file.display()
        );
        if let Some(at) = at {
            let name = file.display().to_string();
            assert!(
                stderr.contains(&format!("{name}:{at}:")),
                "{}: expected position {at} in:\n{stderr}",
                file.display()
            );
        }
        assert!(
            !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
            "{stderr}"
        );
    }
}

#[test]
fn valid_plans_and_shipped_configs_validate() {
    let mut files = fixtures("valid");
    files.extend(
        std::fs::read_dir(repo_root().join("configs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml")),
    );
    for file in files {
        let out = Command::new(orchestrate())
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn missing_plan_file_and_bad_arguments_exit_2() {
    let out = Command::new(orchestrate())
        .args(["validate", "/nonexistent/plan.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/plan.toml"));
    let out = Command::new(orchestrate())
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(orchestrate()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no plan and no subcommand");
}

#[test]
fn schema_is_json_describing_stages() {
    let out = Command::new(orchestrate()).arg("schema").output().unwrap();
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = schema.to_string();
    for key in [
        "stage", "after", "kind", "command", "init", "timeout", "retries", "gpus", "env",
    ] {
        assert!(
            text.contains(&format!("\"{key}\"")),
            "schema mentions {key}"
        );
    }
}

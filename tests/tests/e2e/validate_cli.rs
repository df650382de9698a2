//! `orchestrate validate` on every fixture plan: invalid ones exit 2 with the expected message
//! (and position), never a panic; valid ones exit 0. Also `orchestrate schema`.

use e2e_tests::fixtures::{expectation, plans as fixtures};
use e2e_tests::{orchestrate, repo_root};
use std::process::Command;

/// `orchestrate validate PLAN`.
fn validate(plan: &std::path::Path) -> std::process::Output {
    Command::new(orchestrate())
        .arg("validate")
        .arg(plan)
        .output()
        .unwrap()
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
        let expect = expectation(&file);
        let out = validate(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", file.display());
        assert!(
            stderr.contains(&expect.message),
            "{}: expected `{}` in:\n{stderr}",
            file.display(),
            expect.message
        );
        if let Some((line, col)) = expect.at {
            let name = file.display().to_string();
            assert!(
                stderr.contains(&format!("{name}:{line}:{col}:")),
                "{}: expected position {line}:{col} in:\n{stderr}",
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
        let out = validate(&file);
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

#[test]
fn one_validate_lists_the_problems_of_every_stage_and_missing_files() {
    let s = e2e_tests::Scratch::new("validate-all");
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nretries = \"x\"\n[[stage]]\nname = \"b\"\ncommand = [\"true\"]\nbogus = 1\n[[stage]]\nname = \"c\"\ncommand = [\"true\"]\ntimeout = 5\n",
    );
    let out = validate(&plan);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["`retries`", "bogus", "stage `c`"] {
        assert!(err.contains(needle), "{needle} in one pass: {err}");
    }
    let plan = s.write(
        "files.toml",
        "[[stage]]\nname = \"t\"\nkind = \"train\"\n[stage.params]\ndata = \"missing.txt\"\n[[stage]]\nname = \"m\"\nmatrix = { f = { glob = \"nothere/*.jsonl\" } }\ncommand = [\"true\"]\n[[stage]]\nname = \"n\"\nafter = [\"nope\"]\ncommand = [\"true\"]\n",
    );
    let out = validate(&plan);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["missing.txt", "nothere", "nope"] {
        assert!(err.contains(needle), "{needle} in one pass: {err}");
    }
}

#[test]
fn validate_warns_before_a_stage_would_be_too_big_to_start() {
    let s = e2e_tests::Scratch::new("validate-argmax");
    let big = "x".repeat(100 << 10);
    let plan = s.write(
        "plan.toml",
        &format!("[[stage]]\nname = \"a\"\ncommand = [\"echo\", \"{big}\"]\n"),
    );
    let out = validate(&plan);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: stage `a`"), "{err}");
}

#[test]
fn gpu_check_json_stays_json_without_nvml() {
    let out = Command::new(orchestrate())
        .args(["gpu-check", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON on stdout ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    if out.status.code() == Some(4) {
        assert_eq!(v["available"], false);
        let error = v["error"].as_str().unwrap();
        assert!(
            error.contains("NVML") || error.contains("no NVIDIA driver found"),
            "{error}"
        );
    } else {
        assert!(v["gpus"].is_array(), "with NVML: the inventory");
    }
}

#[test]
fn an_argument_longer_than_the_kernel_takes_fails_validation_and_a_long_one_warns() {
    let s = e2e_tests::Scratch::new("validate-arg-size");
    let plan = |kib: usize| {
        format!(
            "[[stage]]\nname = \"big\"\ncommand = [\"echo\", \"{}\"]\n",
            "x".repeat(kib << 10)
        )
    };
    let over = s.write("over.toml", &plan(130));
    let out = validate(&over);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: stage `big`: one of its arguments or variables is 130 KiB"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ok"));
    // Near the limit but under it: a warning, and the plan is valid.
    let near = s.write("near.toml", &plan(100));
    let out = validate(&near);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: stage `big`"));
}

#[test]
fn a_duration_too_long_to_hold_is_called_too_long() {
    let s = e2e_tests::Scratch::new("validate-duration-overflow");
    let plan = s.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\ntimeout = \"99999999999999999999d\"\n",
    );
    let out = validate(&plan);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is longer than the most a plan may give"),
        "{stderr}"
    );
    assert!(!stderr.contains("write a number and a unit"), "{stderr}");
}

#[test]
fn a_json_plan_naming_a_key_twice_is_refused_as_a_toml_one_is() {
    let s = e2e_tests::Scratch::new("validate-json-duplicate");
    let plan = s.write(
        "plan.json",
        "{\"stage\": [{\"name\": \"a\", \"command\": [\"true\"],\n  \"env\": {\"A\": \"1\", \"A\": \"2\"}}]}\n",
    );
    let out = validate(&plan);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let name = plan.display().to_string();
    assert!(
        stderr.contains(&format!(
            "{name}:2:21: error: `A` is given twice in one object (first at line 2)"
        )),
        "{stderr}"
    );
    let toml = s.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nenv = { A = \"1\", A = \"2\" }\n",
    );
    assert_eq!(validate(&toml).status.code(), Some(2));
}

#[test]
fn a_byte_order_mark_is_skipped_in_json_plans_as_in_toml_ones() {
    let s = e2e_tests::Scratch::new("validate-bom");
    let toml = s.write(
        "plan.toml",
        "\u{feff}[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n",
    );
    let json = s.write(
        "plan.json",
        "\u{feff}{\"stage\": [{\"name\": \"a\", \"command\": [\"true\"]}]}\n",
    );
    for plan in [toml, json] {
        let out = validate(&plan);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            plan.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn matrix_problems_are_said_in_the_plan_s_words_and_non_ascii_values_name_instances() {
    let s = e2e_tests::Scratch::new("validate-matrix-words");
    let plan = |name: &str, matrix: &str| {
        s.write(
            name,
            &format!(
                "[[stage]]\nname = \"m\"\ncommand = [\"true\"]\nmatrix = {{ v = {matrix} }}\n"
            ),
        )
    };
    let out = validate(&plan("number.toml", "3"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`matrix.v` must be a list of values, `{ lines = \"FILE\" }` or `{ glob = \"PATTERN\" }`"),
        "{stderr}"
    );
    assert!(!stderr.contains("enum"), "no Rust internals: {stderr}");
    let out = validate(&plan("twice.toml", "[1, 2, 1]"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("matrix key `v` has the value `1` twice"),
        "{stderr}"
    );
    let out = validate(&plan("words.toml", "[\"日本\", \"中文\"]"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 stages"), "{stdout}");
}

#[test]
fn a_matrix_source_table_names_one_source_and_nothing_else() {
    let s = e2e_tests::Scratch::new("validate-matrix-source");
    s.write("vals.txt", "a\nb\n");
    for (name, table, found) in [
        (
            "both.toml",
            "{ lines = \"vals.txt\", glob = \"*.txt\" }",
            "`glob`, `lines`",
        ),
        ("typo.toml", "{ line = \"vals.txt\" }", "`line`"),
        (
            "extra.toml",
            "{ lines = \"vals.txt\", sort = true }",
            "`lines`, `sort`",
        ),
    ] {
        let plan = s.write(
            name,
            &format!("[[stage]]\nname = \"m\"\ncommand = [\"true\"]\nmatrix = {{ v = {table} }}\n"),
        );
        let out = validate(&plan);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("a matrix source table has exactly one key, `lines` (a file) or `glob` (a pattern); this one has {found}")),
            "{name}: {stderr}"
        );
    }
    let plan = s.write(
        "good.toml",
        "[[stage]]\nname = \"m\"\ncommand = [\"true\"]\nmatrix = { v = { lines = \"vals.txt\" } }\n",
    );
    assert_eq!(validate(&plan).status.code(), Some(0));
}

#[test]
fn the_errors_of_every_stage_have_their_line_and_column_as_the_first_one_does() {
    // Before: only the first stage's error had a position; `timeout` (and every other) errors
    // of the stages after it read `plan.toml: error: stage `c`: invalid type: integer `5`, …`.
    let s = e2e_tests::Scratch::new("validate-positions");
    let toml = s.write(
        "plan.toml",
        "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\nretries = \"x\"\n[[stage]]\nname = \"b\"\ncommand = [\"true\"]\ntimeout = \"xyz\"\n[[stage]]\nname = \"c\"\ncommand = [\"true\"]\ntimeout = 5\n[[stage]]\ncommand = [\"true\"]\nbogus = 1\n",
    );
    let json = s.write(
        "plan.json",
        "{\"stage\": [{\"name\": \"a\", \"command\": [\"true\"], \"retries\": \"x\"},\n  {\"name\": \"b\", \"command\": [\"true\"], \"timeout\": \"xyz\"},\n  {\"name\": \"c\", \"command\": [\"true\"], \"timeout\": 5},\n  {\"command\": [\"true\"], \"bogus\": 1}]}\n",
    );
    for (plan, expected) in [
        (
            &toml,
            [
                ":4:11: error: stage `a`: `retries` must be a whole number",
                ":8:11: error: stage `b`: `timeout` is not a valid duration: `xyz`",
                ":12:11: error: stage `c`: `timeout` must be a duration such as \"90s\", \"30m\" or \"1h30m\", not 5",
                ":15:1: error: stage #4: unknown key `bogus`",
            ],
        ),
        (
            &json,
            [
                ":1:58: error: stage `a`: `retries` must be a whole number",
                ":2:49: error: stage `b`: `timeout` is not a valid duration: `xyz`",
                ":3:49: error: stage `c`: `timeout` must be a duration such as \"90s\", \"30m\" or \"1h30m\", not 5",
                ":4:25: error: stage #4: unknown key `bogus`",
            ],
        ),
    ] {
        let out = validate(plan);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let name = plan.display().to_string();
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("error:")).collect();
        assert_eq!(lines.len(), expected.len(), "{stderr}");
        for (line, expected) in lines.iter().zip(expected) {
            assert!(
                line.starts_with(&format!("{name}{expected}")),
                "expected `{name}{expected}…`, got:\n{stderr}"
            );
        }
    }
}

/// A plan of one stage whose `env` has `n` variables named by `name`, as TOML and as JSON.
fn env_plans(
    s: &e2e_tests::Scratch,
    n: usize,
    name: fn(usize) -> String,
) -> [std::path::PathBuf; 2] {
    let mut toml = String::from("[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n[stage.env]\n");
    let mut env = serde_json::Map::new();
    for i in 0..n {
        toml.push_str(&format!("\"{}\" = \"v\"\n", name(i)));
        env.insert(name(i), "v".into());
    }
    let json = serde_json::json!({"stage": [{"name": "a", "command": ["true"], "env": env}]});
    [
        s.write("env.toml", &toml),
        // On one line: every position is a column of it.
        s.write("env.json", &json.to_string()),
    ]
}

#[test]
fn a_100000_variable_env_validates_in_time_linear_in_its_size() {
    // Before: 62 s (release build; 40,000 variables took 3.8 s, and several minutes on a debug
    // build): each variable's key was looked up through the whole table. Now a few seconds on
    // a debug build; 20 s leaves room for a loaded machine.
    const N: usize = 100_000;
    let bound = std::time::Duration::from_secs(20);
    let s = e2e_tests::Scratch::new("validate-big-env");
    for plan in env_plans(&s, N, |i| format!("VAR_{i}")) {
        let started = std::time::Instant::now();
        let out = validate(&plan);
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {stdout}{}",
            plan.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("ok (1 stage"), "{stdout}");
        assert!(took < bound, "{}: {took:?}", plan.display());
    }
    // Every variable wrong: each reported at its place, still in linear time (the columns of
    // a one-line JSON plan were counted from the line's start for each).
    let s = e2e_tests::Scratch::new("validate-big-env-wrong");
    let [_, json] = env_plans(&s, N, |i| format!("{i}X"));
    let started = std::time::Instant::now();
    let out = validate(&json);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    let reported = stderr
        .lines()
        .filter(|l| l.contains("is not a valid variable name"))
        .count();
    assert_eq!(reported, N);
    let last = format!("`env` key `{}X` is not a valid variable name", N - 1);
    let text = std::fs::read_to_string(&json).unwrap();
    let column = text.find(&format!("\"{}X\"", N - 1)).unwrap() + 1;
    assert!(
        stderr.contains(&format!(
            "{}:1:{column}: error: stage `a`: {last}",
            json.display()
        )),
        "the last variable at its column {column}"
    );
    assert!(took < bound, "{took:?}");
}

/// Runs `validate` on `plan`; its output and how long it took.
fn timed_validate(plan: &std::path::Path) -> (std::process::Output, std::time::Duration) {
    let started = std::time::Instant::now();
    let out = validate(plan);
    (out, started.elapsed())
}

#[test]
fn a_40000_entry_after_list_and_40000_unknown_params_validate_in_linear_time() {
    // Before: 12 s and 10 s on a debug build (5.2 s and 6.1 s release): each `after` entry was
    // compared with every one before it, and each unknown key looked up through the whole
    // `params` table. Now well under a second each (release), about 1 s (debug); the bound
    // leaves room for a loaded machine and fails the quadratic version.
    const N: usize = 40_000;
    let bound = std::time::Duration::from_secs(5);
    let s = e2e_tests::Scratch::new("validate-long-after");
    let after: Vec<String> = (0..N).map(|i| format!("\"x{i}\"")).collect();
    let plan = s.write(
        "after.toml",
        &format!(
            "[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n\n[[stage]]\nname = \"b\"\ncommand = [\"true\"]\nafter = [{}]\n",
            after.join(", ")
        ),
    );
    let (out, took) = timed_validate(&plan);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let reported = stderr
        .lines()
        .filter(|l| l.contains("which is not a stage"))
        .count();
    assert_eq!(reported, N);
    assert!(took < bound, "{N} `after` entries: {took:?}");

    let mut params = String::from("[[stage]]\nname = \"t\"\nkind = \"train\"\n[stage.params]\n");
    for i in 0..N {
        params.push_str(&format!("k{i} = 1\n"));
    }
    let plan = s.write("params.toml", &params);
    let (out, took) = timed_validate(&plan);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let reported = stderr
        .lines()
        .filter(|l| l.contains("unknown key `k"))
        .count();
    assert_eq!(reported, N);
    // Each at its own line (the keys start on line 5).
    let last = format!(
        "params.toml:{}:1: error: stage `t`: unknown key `k{}`",
        N + 4,
        N - 1
    );
    assert!(stderr.contains(&last), "the last key at its line");
    assert!(took < bound, "{N} unknown params: {took:?}");
}

#[test]
fn a_command_stage_without_gpus_on_a_gpu_machine_is_told_it_gets_none() {
    let s = e2e_tests::Scratch::new("validate-no-gpu");
    let plan = s.write(
        "plan.toml",
        r#"
[[stage]]
name = "train"
command = ["sh", "-c", "echo \"[$CUDA_VISIBLE_DEVICES]\""]

[[stage]]
name = "sweep"
matrix = { i = [1, 2, 3] }
command = ["true"]

[[stage]]
name = "cpu-only"
command = ["true"]
gpus = 0
"#,
    );
    let with_gpus = |cmd: &mut Command| {
        cmd.env("ORCHESTRATE_FAKE_GPUS", "2")
            .env("ORCHESTRATE_FAKE_GPU_DIR", s.path());
    };
    let mut check = Command::new(orchestrate());
    check.arg("validate").arg(&plan);
    with_gpus(&mut check);
    let out = check.output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: stage `train` gets no GPU") && err.contains("2 GPU(s)"),
        "{err}"
    );
    assert_eq!(err.matches("stage `sweep` gets no GPU").count(), 1, "{err}");
    assert!(
        !err.contains("cpu-only"),
        "gpus = 0 says it on purpose: {err}"
    );
    // Without GPUs there is nothing to say.
    let out = validate(&plan);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("gets no GPU"));

    // The run's start line says it too.
    let mut run = Command::new(orchestrate());
    run.arg("--plan")
        .arg(&plan)
        .arg("--run-dir")
        .arg(s.path().join("run"));
    with_gpus(&mut run);
    let out = run.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("train: started, pid")
            && err.contains("no GPU: this machine's GPUs are hidden from it"),
        "{err}"
    );
}

//! A zygote reads ahead: it reads the script of the stage it is started for (its source, with
//! nothing run) and imports what that script imports at its top level before it says it is
//! ready, so that the first stage it forks, in the first sweep from an empty cache, finds a
//! lazily loaded class (`from pkg import Name`, loaded on attribute access as transformers'
//! model classes are) already imported. What would leave the zygote unfit is left out and
//! named; the user's own modules (beside the script, in the working directory) are read for
//! what they import, never imported; a later stage's script with other imports teaches the
//! next generation at its fork.

use super::*;

/// A package whose class `Model` is loaded on first access, as transformers' lazy modules
/// load their model classes: a module-level `__getattr__` that imports the submodule and
/// keeps what it found.
const LAZY_INIT: &str = "def __getattr__(name):\n    if name == 'Model':\n        \
    from .modeling import Model\n        globals()[name] = Model\n        return Model\n    \
    raise AttributeError(name)\n";

/// Waits, in a stage that imported `heavy` itself (exec'd while its zygote imports), until a
/// zygote says it is ready in its lineage's log (in `zygote-cache` beside `MODS`), and a
/// moment more for orchestrate to read its ready message: the next stage is then forked.
const UNTIL_READY: &str = r#"
if heavy.IMPORTED_IN == os.getpid():
    cache = os.path.join(os.path.dirname(os.environ["MODS"]), "zygote-cache")
    end = time.time() + 60
    while not any(" ready: " in open(p).read() for p in glob.glob(os.path.join(cache, "*.log"))):
        if time.time() > end:
            sys.exit("no zygote became ready")
        time.sleep(0.05)
    time.sleep(1.0)
"#;

/// A sweep's script: notes which of `watched` were loaded at its first line (what its zygote
/// held), imports `imports` at its top level (with `heavy`, the plan's preload module), waits
/// for the zygote when exec'd ([`UNTIL_READY`]), and prints what it noted. With `exit_now` it
/// ends with `os._exit` (a stage that ends so teaches nothing at its exit).
fn sweep_script(watched: &[&str], imports: &str, exit_now: bool) -> String {
    format!(
        "import glob, json, os, sys, time\n\
         held = {{m: m in sys.modules for m in {watched:?}}}\n\
         import heavy\n{imports}\n{UNTIL_READY}\n\
         print(json.dumps(held), flush=True)\n{}",
        if exit_now { "os._exit(0)\n" } else { "" }
    )
}

/// Runs a chain of stages, each `(name, script)` after the one before, under `preload =
/// ["heavy"]`, with `pythonpath` and `MODS` (the test's `mods`) in their environment and
/// orchestrate's environment plus `env`; asserts it succeeded and returns its run directory.
fn run_sweep(
    s: &Scratch,
    pythonpath: &str,
    stages: &[(&str, &str)],
    env: &[(&str, &str)],
) -> std::path::PathBuf {
    let mods = s.path().join("mods");
    let mut plan = String::from("[run]\npreload = [\"heavy\"]\n\n");
    for (i, (name, script)) in stages.iter().enumerate() {
        let after = match i {
            0 => String::new(),
            _ => format!("after = [\"{}\"]\n", stages[i - 1].0),
        };
        plan += &format!(
            "[[stage]]\nname = \"{name}\"\n{after}command = [\"python3\", \"{script}\"]\n\
             env = {{ PYTHONPATH = \"{pythonpath}\", MODS = \"{}\" }}\n\n",
            mods.display()
        );
    }
    let plan = s.write("plan.toml", &plan);
    let run_dir = s.path().join("run");
    ok(&run(&plan, &run_dir, env));
    run_dir
}

/// The modules of these tests in the test's `mods`: the zygote tests' own ([`write_modules`]),
/// `plainmod`, and with `lazy` the lazily loading package `lazypkg` ([`LAZY_INIT`]).
fn write_sweep_modules(s: &Scratch, lazy: bool) {
    write_modules(s);
    s.write("mods/plainmod.py", "X = 1\n");
    if lazy {
        s.write("mods/lazypkg/__init__.py", LAZY_INIT);
        s.write("mods/lazypkg/modeling.py", "class Model:\n    pass\n");
    }
}

/// What the lineage's log says (the zygote cache beside the test's run).
fn zygote_log(s: &Scratch) -> String {
    cache_files(s, "log").concat()
}

/// The modules a forked stage reported importing itself (the first few).
fn imported_itself(start: &Value) -> Vec<String> {
    start["imported"]["first"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn the_first_sweep_from_an_empty_cache_forks_its_second_stage_with_the_script_s_imports_held() {
    python_available();
    let s = Scratch::new("zygote-read-ahead");
    write_sweep_modules(&s, true);
    s.write("mods/othermod.py", "X = 2\n");
    let watched = ["plainmod", "lazypkg", "lazypkg.modeling", "othermod"];
    let uses = "import plainmod\nfrom lazypkg import Model\n";
    s.write("uses.py", &sweep_script(&watched, uses, false));
    // Another script, which ends with os._exit: what it imports is learned at its fork alone.
    s.write(
        "other.py",
        &sweep_script(&watched, "import othermod\n", true),
    );
    s.write("awaits.py", AWAITS_NEXT);
    let mods = s.path().join("mods").display().to_string();
    let run_dir = run_sweep(
        &s,
        &mods,
        &[
            ("first", "uses.py"),
            ("second", "uses.py"),
            ("third", "uses.py"),
            ("other", "other.py"),
            ("wait", "awaits.py"),
            ("other_again", "other.py"),
        ],
        &[],
    );
    // The first stage is exec'd while the zygote imports (and reads uses.py ahead).
    assert_eq!(stage_start(&run_dir, "first")["via"], "exec");
    // The second is forked from generation 1, which already held the script's imports, the
    // lazily loaded class included: it imported none of them itself.
    for name in ["second", "third"] {
        let start = stage_start(&run_dir, name);
        assert_eq!(start["via"], "zygote", "{name}: {start}");
        assert_eq!(start["generation"], 1, "{name}: {start}");
        assert_eq!(start["read_ahead"]["script"], "uses.py", "{name}: {start}");
        let modules = start["read_ahead"]["modules"].as_array().unwrap();
        assert!(modules.contains(&Value::from("plainmod")), "{start}");
        assert!(modules.contains(&Value::from("lazypkg:Model")), "{start}");
        let held = stdout_json(&run_dir, name);
        assert_eq!(
            held,
            serde_json::json!({"plainmod": true, "lazypkg": true, "lazypkg.modeling": true, "othermod": false}),
            "{name}: what its zygote held at its first line"
        );
        let itself = imported_itself(&start);
        for module in ["plainmod", "lazypkg", "lazypkg.modeling"] {
            assert!(!itself.contains(&module.to_string()), "{name}: {start}");
        }
    }
    let log = zygote_log(&s);
    assert!(
        log.contains("read ahead from uses.py: glob, plainmod, lazypkg:Model"),
        "{log}"
    );
    // A stage with another script, forked from generation 1 (which lacks `othermod`), teaches
    // it at its fork: it ends with os._exit, which teaches nothing at exit...
    let other = stage_start(&run_dir, "other");
    assert_eq!(other["via"], "zygote", "{other}");
    assert!(other["imported"].is_null(), "{other}");
    assert_eq!(stdout_json(&run_dir, "other")["othermod"], false);
    assert!(log.contains("lacks: othermod"), "{log}");
    // ...and the next generation imported it before forking the same script again.
    let again = stage_start(&run_dir, "other_again");
    assert_eq!(again["via"], "zygote", "{again}");
    assert!(
        again["generation"].as_u64() > other["generation"].as_u64(),
        "{other} {again}"
    );
    assert_eq!(stdout_json(&run_dir, "other_again")["othermod"], true);
    // Kept for the next run: what was read ahead, what was learned at the fork.
    let kept = cache_files(&s, "json");
    assert_eq!(kept.len(), 1, "{kept:?}");
    let kept: Value = serde_json::from_str(&kept[0]).unwrap();
    let learned = kept["learned"].as_array().unwrap();
    for module in ["plainmod", "lazypkg:Model", "othermod"] {
        assert!(learned.contains(&Value::from(module)), "{kept}");
    }
}

#[test]
fn a_script_import_that_would_leave_the_zygote_unfit_is_left_out_and_named() {
    python_available();
    let s = Scratch::new("zygote-read-ahead-unfit");
    write_sweep_modules(&s, false);
    s.write("mods/threader/__init__.py", THREADER);
    // Reads, at import, a variable orchestrate sets for each stage.
    s.write(
        "mods/stagereader.py",
        "import os\nSTAGE = os.environ.get('ORCHESTRATE_STAGE')\n",
    );
    let watched = ["plainmod", "threader", "stagereader"];
    let imports = "import plainmod, threader\nimport stagereader\n";
    s.write("unfit.py", &sweep_script(&watched, imports, false));
    let mods = s.path().join("mods").display().to_string();
    let run_dir = run_sweep(
        &s,
        &mods,
        &[("first", "unfit.py"), ("second", "unfit.py")],
        &[],
    );
    let report = read_report(&run_dir);
    for name in ["first", "second"] {
        assert_eq!(report_stage(&report, name)["status"], "succeeded");
    }
    let second = stage_start(&run_dir, "second");
    assert_eq!(second["via"], "zygote", "{second}");
    let left_out = second["left_out"].as_array().unwrap();
    let why = |module: &str| {
        left_out
            .iter()
            .find(|l| l["module"] == module)
            .unwrap_or_else(|| panic!("{module} is left out: {second}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(why("threader").contains("threader-sleeps"), "{second}");
    assert!(why("stagereader").contains("ORCHESTRATE_STAGE"), "{second}");
    // `glob` is the standard library's, which the script imports too.
    assert_eq!(
        second["read_ahead"]["modules"],
        serde_json::json!(["glob", "plainmod"]),
        "{second}"
    );
    assert_eq!(
        stdout_json(&run_dir, "second"),
        serde_json::json!({"plainmod": true, "threader": false, "stagereader": false})
    );
    let kept: Value = serde_json::from_str(&cache_files(&s, "json")[0]).unwrap();
    let never: Vec<&str> = (kept["left_out"].as_array().unwrap().iter())
        .map(|l| l["module"].as_str().unwrap())
        .collect();
    assert!(
        never.contains(&"threader") && never.contains(&"stagereader"),
        "{kept}"
    );
}

#[test]
fn the_user_s_own_modules_beside_the_script_or_in_the_working_directory_are_not_read_ahead() {
    python_available();
    let s = Scratch::new("zygote-read-ahead-own");
    write_sweep_modules(&s, false);
    // Beside the script, and in the stage's working directory (the plan's): the user's own,
    // which another stage may have otherwise, although the zygote's PYTHONPATH finds both.
    s.write("scripts/localmod.py", "X = 1\n");
    s.write("cwdmod.py", "X = 1\n");
    s.write("scripts/localpkg/__init__.py", LAZY_INIT);
    s.write("scripts/localpkg/modeling.py", "class Model:\n    pass\n");
    let watched = ["plainmod", "localmod", "cwdmod", "localpkg"];
    let imports = "import plainmod, localmod, cwdmod\nfrom localpkg import Model\n";
    s.write("scripts/own.py", &sweep_script(&watched, imports, false));
    let pythonpath = format!(
        "{}:{}:{}",
        s.path().join("mods").display(),
        s.path().display(),
        s.path().join("scripts").display()
    );
    let run_dir = run_sweep(
        &s,
        &pythonpath,
        &[("first", "scripts/own.py"), ("second", "scripts/own.py")],
        &[],
    );
    let second = stage_start(&run_dir, "second");
    assert_eq!(second["via"], "zygote", "{second}");
    assert_eq!(
        second["read_ahead"],
        serde_json::json!({"script": "scripts/own.py", "modules": ["glob", "plainmod"]}),
        "{second}"
    );
    assert_eq!(
        stdout_json(&run_dir, "second"),
        serde_json::json!({"plainmod": true, "localmod": false, "cwdmod": false, "localpkg": false})
    );
    // The stage imported them itself, as an exec'd one would.
    let itself = imported_itself(&second);
    for module in ["localmod", "cwdmod", "localpkg"] {
        assert!(itself.contains(&module.to_string()), "{second}");
    }
    let log = zygote_log(&s);
    assert!(
        !log.contains("localmod") && !log.contains("cwdmod"),
        "{log}"
    );
}

#[test]
fn what_the_user_s_own_modules_import_is_read_ahead_but_they_are_not_imported() {
    python_available();
    let s = Scratch::new("zygote-read-ahead-follows");
    write_sweep_modules(&s, true);
    // The user's own module beside the script: what the script imports goes through it.
    s.write(
        "scripts/helper.py",
        "import plainmod\nfrom lazypkg import Model\nX = 1\n",
    );
    let watched = ["plainmod", "lazypkg", "lazypkg.modeling", "helper"];
    s.write(
        "scripts/follows.py",
        &sweep_script(&watched, "import helper\n", false),
    );
    let mods = s.path().join("mods").display().to_string();
    let run_dir = run_sweep(
        &s,
        &mods,
        &[
            ("first", "scripts/follows.py"),
            ("second", "scripts/follows.py"),
        ],
        &[],
    );
    let second = stage_start(&run_dir, "second");
    assert_eq!(second["via"], "zygote", "{second}");
    assert_eq!(
        second["read_ahead"],
        serde_json::json!({"script": "scripts/follows.py", "modules": ["glob", "plainmod", "lazypkg:Model"]}),
        "{second}"
    );
    // The zygote held what helper imports, but not helper, which the stage imported itself.
    assert_eq!(
        stdout_json(&run_dir, "second"),
        serde_json::json!({"plainmod": true, "lazypkg": true, "lazypkg.modeling": true, "helper": false})
    );
    let itself = imported_itself(&second);
    assert!(itself.contains(&"helper".to_string()), "{second}");
    for module in ["plainmod", "lazypkg", "lazypkg.modeling"] {
        assert!(!itself.contains(&module.to_string()), "{second}");
    }
    let log = zygote_log(&s);
    assert!(!log.contains("helper"), "{log}");
}

#[test]
fn with_learning_off_nothing_is_read_ahead() {
    python_available();
    let s = Scratch::new("zygote-read-ahead-off");
    write_sweep_modules(&s, false);
    s.write(
        "uses.py",
        &sweep_script(&["plainmod"], "import plainmod\n", false),
    );
    // The stage the zygote is started for imports it too (and waits for the zygote).
    s.write("warm_uses.py", &format!("import plainmod\n{WARM}"));
    let mods = s.path().join("mods").display().to_string();
    let run_dir = run_sweep(
        &s,
        &mods,
        &[("warm", "warm_uses.py"), ("second", "uses.py")],
        &[("ORCHESTRATE_ZYGOTE_LEARN", "0")],
    );
    let second = stage_start(&run_dir, "second");
    assert_eq!(second["via"], "zygote", "{second}");
    assert!(second["read_ahead"].is_null(), "{second}");
    assert_eq!(
        stdout_json(&run_dir, "second"),
        serde_json::json!({"plainmod": false})
    );
}

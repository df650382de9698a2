//! The worker contract as the orchestrator fulfils it: the environment variables and argv
//! placeholders every stage gets (documented in `docs/worker-contract.md`).

use protocol::plan::input_env_var;
use protocol::worker::{
    ENV_ATTEMPT, ENV_EVENTS, ENV_INPUTS_FILE, ENV_OUTPUT_DIR, ENV_RESUME_DIR, ENV_RUN_DIR,
    ENV_SPEC, ENV_STAGE, MAX_INPUT_VARS,
};
use std::collections::BTreeMap;
use std::path::Path;

/// Paths one attempt is given.
#[derive(Debug, Clone)]
pub struct ContractPaths<'a> {
    /// The stage's name.
    pub stage: &'a str,
    /// The run directory.
    pub run_dir: &'a Path,
    /// The stage's output directory.
    pub output_dir: &'a Path,
    /// Each upstream stage's output directory.
    pub inputs: &'a BTreeMap<String, std::path::PathBuf>,
    /// The event socket.
    pub events: &'a Path,
    /// The spec file.
    pub spec: &'a Path,
    /// `inputs.json`: every input, by upstream stage name.
    pub inputs_file: &'a Path,
    /// Attempt number.
    pub attempt: u32,
    /// Whether the output directory holds an earlier attempt's files.
    pub resumable: bool,
    /// The attempt's rendezvous port ([`crate::attempt::rendezvous`]): `{master_port}`, and
    /// `MASTER_PORT`/`PET_MASTER_PORT` unless the plan's `env` sets them.
    pub master_port: Option<u16>,
}

/// The `ORCHESTRATE_*` variables of an attempt, then the plan's own `env` entries. Inputs
/// get one variable each up to [`MAX_INPUT_VARS`]; beyond that only the inputs file.
pub fn environment(
    paths: &ContractPaths<'_>,
    plan_env: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    // Sized for all it will hold: one allocation instead of the growth pushes would make.
    let inputs = if paths.inputs.len() <= MAX_INPUT_VARS {
        paths.inputs.len()
    } else {
        0
    };
    let ports = paths
        .master_port
        .map_or(0, |_| crate::attempt::rendezvous::PORT_VARS.len());
    let mut env = Vec::with_capacity(8 + inputs + ports + plan_env.len());
    env.extend([
        (ENV_STAGE.to_string(), paths.stage.to_string()),
        (
            ENV_RUN_DIR.to_string(),
            paths.run_dir.to_string_lossy().into_owned(),
        ),
        (
            ENV_OUTPUT_DIR.to_string(),
            paths.output_dir.to_string_lossy().into_owned(),
        ),
        (
            ENV_EVENTS.to_string(),
            paths.events.to_string_lossy().into_owned(),
        ),
        (
            ENV_SPEC.to_string(),
            paths.spec.to_string_lossy().into_owned(),
        ),
        (
            ENV_INPUTS_FILE.to_string(),
            paths.inputs_file.to_string_lossy().into_owned(),
        ),
        (ENV_ATTEMPT.to_string(), paths.attempt.to_string()),
    ]);
    if paths.resumable {
        env.push((
            ENV_RESUME_DIR.to_string(),
            paths.output_dir.to_string_lossy().into_owned(),
        ));
    }
    for (name, dir) in paths
        .inputs
        .iter()
        .filter(|_| paths.inputs.len() <= MAX_INPUT_VARS)
    {
        env.push((input_env_var(name), dir.to_string_lossy().into_owned()));
    }
    if let Some(port) = paths.master_port {
        for var in crate::attempt::rendezvous::PORT_VARS {
            if !plan_env.contains_key(var) {
                env.push((var.to_string(), port.to_string()));
            }
        }
    }
    env.extend(plan_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Expands `{output}`, `{input.NAME}`, `{run_dir}`, `{stage}` and `{master_port}` in one argument;
/// `{{` and `}}` stand for literal braces (the grammar of [`crate::plan::placeholder`]). An
/// argument that does not parse, or names no known input, is passed as written: validation refuses
/// those before a run starts.
pub fn expand(arg: &str, paths: &ContractPaths<'_>) -> String {
    use crate::plan::placeholder::{parse, Piece, Placeholder};
    // Most arguments hold no brace at all: nothing to parse (a sweep expands thousands).
    if !arg.contains(['{', '}']) {
        return arg.to_string();
    }
    let Ok(pieces) = parse(arg) else {
        return arg.to_string();
    };
    let mut out = String::with_capacity(arg.len());
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(&text),
            Piece::Placeholder(Placeholder::Output) => {
                out.push_str(&paths.output_dir.to_string_lossy())
            }
            Piece::Placeholder(Placeholder::RunDir) => {
                out.push_str(&paths.run_dir.to_string_lossy())
            }
            Piece::Placeholder(Placeholder::Stage) => out.push_str(paths.stage),
            Piece::Placeholder(Placeholder::MasterPort) => match paths.master_port {
                Some(port) => out.push_str(&port.to_string()),
                None => return arg.to_string(),
            },
            // Matrix values are substituted when the plan is expanded; none is left here.
            Piece::Placeholder(Placeholder::Matrix(_)) => return arg.to_string(),
            Piece::Placeholder(Placeholder::Input(name)) => match paths.inputs.get(name) {
                Some(dir) => out.push_str(&dir.to_string_lossy()),
                None => return arg.to_string(),
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn expands_placeholders_and_escapes() {
        let inputs = BTreeMap::from([(
            "pre-train".to_string(),
            PathBuf::from("/r/stages/pre-train/output"),
        )]);
        let paths = ContractPaths {
            stage: "sft",
            run_dir: Path::new("/r"),
            output_dir: Path::new("/r/stages/sft/output"),
            inputs: &inputs,
            events: Path::new("/tmp/e.sock"),
            spec: Path::new("/r/stages/sft/spec.json"),
            inputs_file: Path::new("/r/stages/sft/inputs.json"),
            attempt: 2,
            resumable: true,
            master_port: Some(23456),
        };
        assert_eq!(
            expand("--out={output}/m.pt", &paths),
            "--out=/r/stages/sft/output/m.pt"
        );
        assert_eq!(
            expand("{input.pre-train}", &paths),
            "/r/stages/pre-train/output"
        );
        assert_eq!(
            expand("{{literal}} {stage}@{run_dir}", &paths),
            "{literal} sft@/r"
        );
        assert_eq!(expand("--port={master_port}", &paths), "--port=23456");
        assert_eq!(expand("{unknown}", &paths), "{unknown}");
        assert_eq!(expand("{input.nope}", &paths), "{input.nope}");
        let env = environment(&paths, &BTreeMap::from([("A".into(), "1".into())]));
        assert!(env.contains(&(
            "ORCHESTRATE_INPUT_PRE_TRAIN".into(),
            "/r/stages/pre-train/output".into()
        )));
        assert!(env.contains(&("ORCHESTRATE_ATTEMPT".into(), "2".into())));
        assert!(env.contains(&(
            "ORCHESTRATE_RESUME_DIR".into(),
            "/r/stages/sft/output".into()
        )));
        assert_eq!(env.last().unwrap(), &("A".to_string(), "1".to_string()));
        assert!(env.contains(&("MASTER_PORT".into(), "23456".into())));
        assert!(env.contains(&("PET_MASTER_PORT".into(), "23456".into())));
        let own = environment(
            &paths,
            &BTreeMap::from([("MASTER_PORT".into(), "1".into())]),
        );
        assert_eq!(own.iter().filter(|(k, _)| k == "MASTER_PORT").count(), 1);
        assert!(env.contains(&(
            "ORCHESTRATE_INPUTS_FILE".into(),
            "/r/stages/sft/inputs.json".into()
        )));
    }

    #[test]
    fn many_inputs_go_through_the_file_only() {
        let inputs: BTreeMap<String, PathBuf> = (0..=MAX_INPUT_VARS)
            .map(|i| {
                (
                    format!("ft-{i}"),
                    PathBuf::from(format!("/r/stages/ft-{i}/output")),
                )
            })
            .collect();
        let paths = ContractPaths {
            stage: "agg",
            run_dir: Path::new("/r"),
            output_dir: Path::new("/r/stages/agg/output"),
            inputs: &inputs,
            events: Path::new("/tmp/e.sock"),
            spec: Path::new("/r/stages/agg/spec.json"),
            inputs_file: Path::new("/r/stages/agg/inputs.json"),
            attempt: 1,
            resumable: false,
            master_port: None,
        };
        let env = environment(&paths, &BTreeMap::new());
        assert!(!env.iter().any(|(k, _)| k.starts_with("ORCHESTRATE_INPUT_")));
        assert!(env.iter().any(|(k, _)| k == "ORCHESTRATE_INPUTS_FILE"));
    }
}

//! Reading the stage spec and its parameters, refusing what this worker cannot run.

use crate::failure::{Failure, StageResult};
use protocol::worker::StageSpec;
use protocol::PROTOCOL_VERSION;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Reads and checks the [`StageSpec`] at `path`. A spec of another protocol version, or one
/// that does not parse, is a bad-input failure that says what to do.
pub fn read_spec(path: &Path) -> StageResult<StageSpec> {
    let text = std::fs::read(path).map_err(|e| {
        Failure::bad_input(format!(
            "cannot read the stage spec {}: {e}",
            path.display()
        ))
    })?;
    parse_spec(&text, &path.display().to_string())
}

/// Parses a spec from JSON bytes; `source` names it in errors.
pub fn parse_spec(text: &[u8], source: &str) -> StageResult<StageSpec> {
    let value: serde_json::Value = serde_json::from_slice(text)
        .map_err(|e| Failure::bad_input(format!("the stage spec {source} is not JSON: {e}")))?;
    match value.get("v").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(v) => {
            let advice = if v > u64::from(PROTOCOL_VERSION) {
                "upgrade stage-worker to the orchestrator's version"
            } else {
                "upgrade the orchestrator that wrote it"
            };
            return Err(Failure::bad_input(format!(
                "the stage spec {source} has protocol version {v}, this stage-worker speaks version {PROTOCOL_VERSION}: {advice}"
            )));
        }
        None => {
            return Err(Failure::bad_input(format!(
                "the stage spec {source} has no protocol version field `v` (expected {PROTOCOL_VERSION})"
            )))
        }
    }
    serde_json::from_value(value)
        .map_err(|e| Failure::bad_input(format!("the stage spec {source} is malformed: {e}")))
}

/// Parses a stage's `params` table into `T` (whose unknown fields are refused); the error names
/// the stage and the offending key.
pub fn parse_params<T: DeserializeOwned>(spec: &StageSpec) -> StageResult<T> {
    serde_json::from_value(serde_json::Value::Object(spec.params.clone()))
        .map_err(|e| Failure::bad_input(format!("stage `{}`: invalid params: {e}", spec.stage)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::FailureKind;
    use protocol::worker::TrainParams;

    fn spec_json(v: u32, params: &str) -> String {
        format!(
            r#"{{"v":{v},"stage":"s","kind":"train","params":{params},"output_dir":"/tmp/x","inputs":{{}},"init":null,"device":"cpu","attempt":1}}"#
        )
    }

    #[test]
    fn reads_a_current_spec_and_its_params() {
        let spec = parse_spec(spec_json(1, r#"{"steps":5,"lr":0.01}"#).as_bytes(), "t").unwrap();
        let p: TrainParams = parse_params(&spec).unwrap();
        assert_eq!(p.steps, 5);
        assert_eq!(p.batch_size, TrainParams::default().batch_size);
    }

    #[test]
    fn refuses_other_versions_and_unknown_params() {
        let err = parse_spec(spec_json(2, "{}").as_bytes(), "t").unwrap_err();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message.contains("protocol version 2"),
            "{}",
            err.message
        );
        let spec = parse_spec(spec_json(1, r#"{"stepz":5}"#).as_bytes(), "t").unwrap();
        let err = parse_params::<TrainParams>(&spec).unwrap_err();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(err.message.contains("stepz"), "{}", err.message);
    }
}

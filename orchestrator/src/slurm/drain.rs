//! Draining this node: a GPU fault whose recovery needs a reset or a reboot takes the node out
//! of Slurm's scheduling, with the reason, so that no later job lands on it
//! (`scontrol update nodename=NODE state=drain reason=…`).

use crate::process::reaper::Reaper;
use std::time::Duration;

/// How long `scontrol` may take.
const LIMIT: Duration = Duration::from_secs(10);

/// Drains `node` with `reason`; `Err` says why it could not (not installed, refused).
pub async fn drain_node(reaper: &Reaper, node: &str, reason: &str) -> Result<(), String> {
    let argv = [
        "scontrol".to_string(),
        "update".into(),
        format!("nodename={node}"),
        "state=drain".into(),
        format!("reason={reason}"),
    ];
    super::helper::run_for_output(reaper, &argv, LIMIT)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

//! GPU health: the XIDs the driver reports while stages run, what each means and what it
//! takes to recover, and the error counters read before a stage (the health gate).
//!
//! The meanings and recovery actions are NVIDIA's, from its XID catalog ("XID Errors",
//! docs.nvidia.com/deploy/xid-errors, the "Recovery Action" column) and the GPU memory error
//! management guide (row remapping, page retirement). An XID whose recovery is a GPU reset or
//! a reboot quarantines the GPU: no later stage is placed on it.

/// What NVIDIA says about one XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    /// The XID.
    pub xid: u64,
    /// What it means.
    pub meaning: &'static str,
    /// What recovers from it.
    pub action: &'static str,
    /// The GPU needs a reset (or the node a reboot) before it can be trusted again.
    pub needs_reset: bool,
}

/// The XIDs this table names: (xid, meaning, recovery action, needs a reset).
const XIDS: &[(u64, &str, &str, bool)] = &[
    (13, "graphics engine exception (often an application's illegal memory access or out-of-range index)", "restart the application; none for the GPU", false),
    (31, "GPU memory page fault (MMU fault: an application accessed an illegal address)", "restart the application; none for the GPU", false),
    (43, "GPU stopped processing (the application's context was torn down after a fault)", "restart the application; none for the GPU", false),
    (45, "preemptive cleanup, due to a previous error (processes were ended)", "none; look at the XID before it", false),
    (48, "double-bit ECC error (uncorrectable memory error)", "reset the GPU", true),
    (61, "internal micro-controller breakpoint/warning", "reset the GPU if it repeats", false),
    (62, "internal micro-controller halt", "reset the GPU", true),
    (63, "ECC page retirement or row remapping recorded", "reset the GPU when convenient to apply it", false),
    (64, "ECC page retirement or row remapping recording failure", "reset the GPU", true),
    (74, "NVLink error", "reset the GPU (and check the NVLink connection)", true),
    (79, "GPU has fallen off the bus", "reboot the node (drain it)", true),
    (92, "high single-bit ECC error rate", "none unless it repeats; watch the counters", false),
    (94, "contained ECC error (the affected application was stopped)", "restart the application; reset the GPU when convenient", false),
    (95, "uncontained ECC error (every application on the GPU is affected)", "reset the GPU", true),
    (119, "GSP RPC timeout (the GPU System Processor stopped answering)", "reset the GPU", true),
    (120, "GSP error", "reset the GPU", true),
    (154, "GPU recovery action changed (the driver says what the GPU needs now)", "follow the recovery action NVML reports (reset or reboot)", true),
];

/// What is known of XID `xid`; an XID outside the table is reported with a pointer to the
/// catalog and is not taken to need a reset.
pub fn xid_info(xid: u64) -> XidInfo {
    match XIDS.iter().find(|(x, ..)| *x == xid) {
        Some(&(xid, meaning, action, needs_reset)) => XidInfo {
            xid,
            meaning,
            action,
            needs_reset,
        },
        None => XidInfo {
            xid,
            meaning: "not in orchestrate's table (see NVIDIA's XID catalog)",
            action: "see NVIDIA's XID catalog",
            needs_reset: false,
        },
    }
}

/// One XID as the report carries it, seen at `at` (Unix seconds).
pub fn xid_record(xid: u64, at: f64) -> protocol::report::XidRecord {
    let info = xid_info(xid);
    protocol::report::XidRecord {
        xid,
        meaning: info.meaning.into(),
        action: info.action.into(),
        needs_reset: info.needs_reset,
        at,
    }
}

/// A GPU's error counters (`None`: the GPU does not keep that one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Uncorrectable ECC errors since the driver loaded (volatile).
    pub uncorrectable_ecc: Option<u64>,
    /// Row remaps waiting for a GPU reset (Ampere and later).
    pub pending_remaps: Option<u64>,
    /// Pages retired (double-bit and multiple single-bit errors; before Ampere).
    pub retired_pages: Option<u64>,
    /// Page retirements waiting for a reset (before Ampere).
    pub pending_retirement: Option<bool>,
}

/// Why a GPU with these counters must not be given to a stage, if it must not: remaps or
/// retirements waiting for a reset, or uncorrectable errors since the driver loaded.
pub fn refusal(c: &Counters) -> Option<String> {
    let mut why = Vec::new();
    if let Some(n @ 1..) = c.pending_remaps {
        why.push(format!("{n} row remap(s) pending a GPU reset"));
    }
    if c.pending_retirement == Some(true) {
        why.push("page retirement pending a GPU reset".to_string());
    }
    if let Some(n @ 1..) = c.uncorrectable_ecc {
        why.push(format!("{n} uncorrectable ECC error(s)"));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// One line for the console and the report: "XID 31 (GPU memory page fault …): restart …".
pub fn describe(x: &protocol::report::XidRecord) -> String {
    format!("XID {} ({}); recovery: {}", x.xid, x.meaning, x.action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_xids_are_named_and_those_that_need_a_reset_say_so() {
        for xid in [
            13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154,
        ] {
            assert!(
                !xid_info(xid).meaning.contains("not in"),
                "XID {xid} is in the table"
            );
        }
        let reset: Vec<u64> = XIDS.iter().filter(|x| x.3).map(|x| x.0).collect();
        for xid in [48, 62, 64, 74, 79, 95, 119] {
            assert!(reset.contains(&xid), "XID {xid} needs a reset");
        }
        assert!(!xid_info(31).needs_reset && !xid_info(13).needs_reset);
        assert!(!xid_info(999).needs_reset);
    }

    #[test]
    fn the_gate_refuses_pending_remaps_and_uncorrectable_errors_and_says_why() {
        assert_eq!(refusal(&Counters::default()), None);
        let clean = Counters {
            uncorrectable_ecc: Some(0),
            pending_remaps: Some(0),
            retired_pages: Some(3),
            pending_retirement: Some(false),
        };
        assert_eq!(refusal(&clean), None);
        let sick = Counters {
            pending_remaps: Some(2),
            uncorrectable_ecc: Some(1),
            ..clean
        };
        assert_eq!(
            refusal(&sick).unwrap(),
            "2 row remap(s) pending a GPU reset, 1 uncorrectable ECC error(s)"
        );
    }
}

//! NVML's side of GPU health: one thread per process that listens for XIDs on every GPU
//! (`nvmlDeviceRegisterEvents` with critical XID errors, then `nvmlEventSetWait`), and the
//! error counters the health gate reads.

use super::health::Counters;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The XIDs seen since the listener started, per GPU UUID, each with when (Unix seconds).
pub(super) type XidLog = Arc<Mutex<HashMap<String, Vec<(f64, u64)>>>>;

/// The process's XID log: empty until [`start_listener`] has run and the driver reports one.
pub(super) fn xid_log() -> XidLog {
    static LOG: OnceLock<XidLog> = OnceLock::new();
    LOG.get_or_init(XidLog::default).clone()
}

/// Starts the process's XID listener, once (later calls do nothing): a thread that registers
/// every GPU NVML lists (one that refuses, with no XID events on it, is left out) and fills
/// [`xid_log`]. Its own `nvmlInit` and registration take NVML's lock, so the host starts it
/// after its own first reads, not beside them.
pub(super) fn start_listener() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let log = xid_log();
        let _ = std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || listen(&log));
    });
}

/// Waits for XIDs for ever (returns if NVML cannot be used).
fn listen(log: &XidLog) {
    let Ok(nvml) = Nvml::init() else { return };
    let Ok(count) = nvml.device_count() else {
        return;
    };
    // A refused registration loses the set: start again without that GPU.
    let mut refused = Vec::new();
    let set = 'register: loop {
        let Ok(mut set) = nvml.create_event_set() else {
            return;
        };
        for index in (0..count).filter(|i| !refused.contains(i)) {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => set = s,
                Err(e) => {
                    tracing::debug!(index, error = %e.error, "no XID events for this GPU");
                    refused.push(index);
                    continue 'register;
                }
            }
        }
        break set;
    };
    loop {
        match set.wait(1000) {
            Ok(data) => {
                let (Some(XidError::Value(xid)), Ok(uuid)) = (data.event_data, data.device.uuid())
                else {
                    continue;
                };
                let at = crate::timefmt::unix_secs_f64();
                tracing::warn!(%uuid, xid, "XID reported");
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.entry(uuid).or_default().push((at, xid));
            }
            Err(NvmlError::Timeout) => {}
            Err(_) => std::thread::sleep(std::time::Duration::from_secs(1)),
        }
    }
}

/// `device`'s error counters; each is `None` where the GPU does not keep it.
pub(super) fn counters(device: &Device) -> Counters {
    let retired = |cause| device.retired_pages(cause).ok().map(|p| p.len() as u64);
    Counters {
        uncorrectable_ecc: device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        pending_remaps: pending_remaps(device),
        retired_pages: retired(RetirementCause::DoubleBitEccError)
            .zip(retired(RetirementCause::MultipleSingleBitEccErrors))
            .map(|(a, b)| a + b),
        pending_retirement: device.are_pages_pending_retired().ok(),
    }
}

/// Rows remapped but waiting for a reset (`nvmlDeviceGetRemappedRows`, Ampere and later),
/// which nvml-wrapper does not wrap: called through its bindings.
fn pending_remaps(device: &Device) -> Option<u64> {
    use nvml_wrapper_sys::bindings::NvmlLib;
    static LIB: OnceLock<Option<NvmlLib>> = OnceLock::new();
    // SAFETY: loading the driver's NVML library, already loaded and initialised by `Nvml`.
    let lib = LIB
        .get_or_init(|| unsafe { NvmlLib::new("libnvidia-ml.so.1").ok() })
        .as_ref()?;
    let get = lib.nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corrected, mut uncorrected, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: a live device handle and four out-parameters, as the function's contract says.
    let status = unsafe {
        get(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failed,
        )
    };
    (status == 0).then_some(u64::from(pending))
}

/// The XIDs of `uuid` in `log` at or after `since`.
pub(super) fn since(log: &XidLog, uuid: &str, since: f64) -> Vec<(f64, u64)> {
    let log = log.lock().unwrap_or_else(|e| e.into_inner());
    log.get(uuid)
        .map(|seen| {
            seen.iter()
                .filter(|(at, _)| *at >= since)
                .copied()
                .collect()
        })
        .unwrap_or_default()
}

//! Choosing and starting the compute device, the compute precision and the CPU thread count.

use crate::failure::{Failure, StageResult};
use protocol::worker::Device as SpecDevice;
use tch::{Device, Kind, Tensor};

/// Where and in what precision a stage computes.
#[derive(Debug, Clone)]
pub struct Compute {
    /// The torch device.
    pub device: Device,
    /// Kind of matrix products and attention: bf16 or fp32 (parameters stay fp32).
    pub kind: Kind,
    /// For the `started` event and logs, such as "cuda:0 NVIDIA H200, bf16" or "cpu, 2 threads, fp32".
    pub description: String,
    /// When [`prepare`] had the CUDA driver initialised (libtorch counted the devices, which
    /// runs `cuInit`; no context existed yet), in Unix seconds; `None` off CUDA. The split of a
    /// stage's start between the driver and its context.
    pub driver_ready_at: Option<f64>,
}

/// What [`release`] did, in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Released {
    /// When the CUDA context was destroyed.
    pub at: f64,
    /// When the NVIDIA device files were closed afterwards, if they were.
    pub driver_closed_at: Option<f64>,
}

/// The compute kind for a `precision` parameter on a device: `"auto"` is bf16 on CUDA and fp32
/// on the CPU; `"bf16"` and `"fp32"` force one.
pub fn compute_kind(precision: &str, cuda: bool) -> StageResult<Kind> {
    match precision {
        "auto" if cuda => Ok(Kind::BFloat16),
        "auto" | "fp32" => Ok(Kind::Float),
        "bf16" => Ok(Kind::BFloat16),
        other => Err(Failure::bad_input(format!(
            "params.precision is `{other}`: use \"auto\", \"bf16\" or \"fp32\""
        ))),
    }
}

/// CPU threads to use: `OMP_NUM_THREADS` when set, else every core this process may run on.
/// (One in unit tests, which already run in parallel.)
pub fn cpu_threads() -> i32 {
    if cfg!(test) {
        return 1;
    }
    std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as i32)
                .unwrap_or(1)
        })
}

/// Sets up the device the spec asks for (CUDA device 0 of `CUDA_VISIBLE_DEVICES`, or the
/// CPU), runs a first operation on it so it is ready, and sets torch's CPU thread count.
pub fn prepare(requested: SpecDevice, precision: &str) -> StageResult<Compute> {
    let threads = cpu_threads();
    tch::set_num_threads(threads);
    match requested {
        SpecDevice::Cpu => {
            let kind = compute_kind(precision, false)?;
            Ok(Compute {
                device: Device::Cpu,
                kind,
                description: format!("cpu, {threads} threads, {}", kind_name(kind)),
                driver_ready_at: None,
            })
        }
        SpecDevice::Cuda if simulated_cuda().is_some() => {
            let kind = compute_kind(precision, false)?;
            Ok(Compute {
                device: Device::Cpu,
                kind,
                description: format!(
                    "cpu (simulating cuda), {threads} threads, {}",
                    kind_name(kind)
                ),
                driver_ready_at: None,
            })
        }
        SpecDevice::Cuda => {
            let kind = compute_kind(precision, true)?;
            let available = tch::Cuda::is_available();
            let driver_ready_at = Some(crate::log::unix_now());
            if !available {
                let visible =
                    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into());
                return Err(Failure::other(format!(
                    "the stage asks for CUDA but libtorch sees no CUDA device (CUDA_VISIBLE_DEVICES={visible}); \
                     check the driver, and that stage-worker was built against a libtorch with CUDA"
                )));
            }
            let Some(kernels) = crate::model::attention::Kernels::from_env() else {
                return Err(Failure::bad_input(
                    "STAGE_WORKER_SDPA must be `auto`, `efficient`, `flash` or `libtorch`"
                        .to_string(),
                ));
            };
            if crate::kernels::fused::wanted_by_env().is_none() {
                return Err(Failure::bad_input(
                    "STAGE_WORKER_FUSED must be `auto` or `off`".to_string(),
                ));
            }
            let device = Device::Cuda(0);
            crate::model::attention::apply(kernels);
            let probe = Tensor::f_ones([1], (Kind::Float, device))?;
            let _ = probe.f_sum(Kind::Float)?.f_double_value(&[])?;
            let name = cuda_device_name().unwrap_or_else(|| "CUDA device".into());
            Ok(Compute {
                device,
                kind,
                description: format!("cuda:0 {name}, {}", kind_name(kind)),
                driver_ready_at,
            })
        }
    }
}

/// For tests on machines without a GPU: `STAGE_WORKER_SIMULATED_CUDA=<ms>` makes a stage given
/// a GPU compute on the CPU and still do what a CUDA stage does at its end — release the
/// "device" once the final checkpoint's data is on the host and announce it — with the
/// checkpoint's manifest written at least `<ms>` milliseconds after the release (a large
/// checkpoint's disk time). The number of milliseconds, when set.
pub fn simulated_cuda() -> Option<u64> {
    static SIMULATED: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *SIMULATED.get_or_init(|| {
        std::env::var("STAGE_WORKER_SIMULATED_CUDA")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// After a simulated release ([`simulated_cuda`]): the disk's simulated time.
pub fn simulated_persist_delay() {
    if let Some(ms) = simulated_cuda() {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Whether a stage that is about to end should give its device back as soon as its final
/// checkpoint is on the host (`STAGE_WORKER_EARLY_RELEASE=0` turns it off).
pub fn early_release_wanted(device: Device) -> bool {
    (device.is_cuda() || simulated_cuda().is_some())
        && std::env::var("STAGE_WORKER_EARLY_RELEASE").map_or(true, |v| v != "0")
}

/// Destroys this process's CUDA context (`cudaDeviceReset` of device 0, the stage's only
/// one), giving its device memory back now rather than at exit, so that the driver's teardown
/// overlaps the rest of the checkpoint's write instead of following it. Only for a process
/// about to exit: libtorch still holds pointers into the destroyed context, so no device call
/// may follow, not even freeing a tensor (the caller forgets them). The stage's isolation is
/// unchanged: the process still exits, and `orchestrate` still verifies with NVML that the
/// memory is back before the next stage may use the device (at once, when the caller reports
/// the release: see `EventSink::announce_released`). Returns when it was done, if it was.
pub fn release() -> Option<Released> {
    if simulated_cuda().is_some() {
        return Some(Released {
            at: crate::log::unix_now(),
            driver_closed_at: None,
        });
    }
    type Sync = unsafe extern "C" fn() -> i32;
    type Reset = unsafe extern "C" fn() -> i32;
    // SAFETY: dlsym of NUL-terminated names in the global scope (libcudart is a dependency of
    // libtorch_cuda, which this binary links); both functions take no arguments and return a
    // cudaError_t (an int). No other thread uses the device now (see the contract above).
    let ok = unsafe {
        let sync = libc::dlsym(libc::RTLD_DEFAULT, c"cudaDeviceSynchronize".as_ptr());
        let reset = libc::dlsym(libc::RTLD_DEFAULT, c"cudaDeviceReset".as_ptr());
        if sync.is_null() || reset.is_null() {
            false
        } else {
            let sync: Sync = std::mem::transmute(sync);
            let reset: Reset = std::mem::transmute(reset);
            sync() == 0 && reset() == 0
        }
    };
    if !ok {
        return None;
    }
    let at = crate::log::unix_now();
    let driver_closed_at = if std::env::var("STAGE_WORKER_CLOSE_DRIVER").map_or(true, |v| v != "0")
    {
        close_driver_files()
    } else {
        None
    };
    Some(Released {
        at,
        driver_closed_at,
    })
}

/// After [`release`], closes this process's descriptors of the NVIDIA device files
/// (`/dev/nvidiactl`, `/dev/nvidia0`, `/dev/nvidia-uvm`; each becomes /dev/null), so that the
/// driver's per-process teardown, which otherwise happens at exit (about 0.07 s on an H200),
/// happens now, alongside the disk. Nothing may use the driver afterwards, which [`release`]'s
/// contract already says. `STAGE_WORKER_CLOSE_DRIVER=0` turns it off. Returns when it was
/// done, if it was.
fn close_driver_files() -> Option<f64> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            target.to_str()?.starts_with("/dev/nvidia").then_some(fd)
        })
        .collect();
    // Each descriptor is pointed at /dev/null (`dup2` closes the device file) rather than
    // closed, so that its number is not reused by a file this process opens next while a
    // thread of the driver's library may still poll or read it.
    let null = std::fs::File::open("/dev/null").ok()?;
    for fd in fds {
        // SAFETY: replaces a descriptor of a device file nothing in this process uses any more
        // (the CUDA context is destroyed and no device call follows) with /dev/null.
        unsafe {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
    Some(crate::log::unix_now())
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bf16",
        _ => "fp32",
    }
}

/// The name of CUDA device 0 from the driver API (`cuDeviceGetName` in the already loaded
/// `libcuda.so.1`), or `None` when it is not available.
fn cuda_device_name() -> Option<String> {
    type GetDevice = unsafe extern "C" fn(*mut i32, i32) -> i32;
    type GetName = unsafe extern "C" fn(*mut libc::c_char, i32, i32) -> i32;
    // SAFETY: dlopen/dlsym with NUL-terminated names; the function types match the CUDA driver
    // API's documented signatures (CUresult is an int, CUdevice an int); the buffer outlives
    // the call and its length is passed.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            return None;
        }
        let get_device = libc::dlsym(lib, c"cuDeviceGet".as_ptr());
        let get_name = libc::dlsym(lib, c"cuDeviceGetName".as_ptr());
        if get_device.is_null() || get_name.is_null() {
            return None;
        }
        let get_device: GetDevice = std::mem::transmute(get_device);
        let get_name: GetName = std::mem::transmute(get_name);
        let mut dev = 0i32;
        if get_device(&mut dev, 0) != 0 {
            return None;
        }
        let mut buf = [0 as libc::c_char; 256];
        if get_name(buf.as_mut_ptr(), buf.len() as i32, dev) != 0 {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(buf.as_ptr())
            .to_string_lossy()
            .into_owned();
        (!name.is_empty()).then_some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_rules() {
        assert_eq!(compute_kind("auto", true).unwrap(), Kind::BFloat16);
        assert_eq!(compute_kind("auto", false).unwrap(), Kind::Float);
        assert_eq!(compute_kind("bf16", false).unwrap(), Kind::BFloat16);
        assert_eq!(compute_kind("fp32", true).unwrap(), Kind::Float);
        let err = compute_kind("fp8", true).unwrap_err();
        assert!(err.message.contains("fp8"));
    }
}

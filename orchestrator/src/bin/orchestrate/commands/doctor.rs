//! `orchestrate doctor`: one screen of what this host offers stages and what is missing, each
//! missing thing with its fix.

use orchestrator::attempt::worker_binary;
use orchestrator::gpu::{Inventory, NvmlUnavailable};
use orchestrator::process::cgroup::host::HostCgroups;
use std::path::Path;
use std::process::{Command, ExitCode};

/// Prints one line per area (GPUs, isolation, built-in worker, Python, Slurm, disk): what is
/// there, or what is missing and how to get it. Exit 0: a missing part is a fact, not an error.
pub(crate) fn doctor() -> ExitCode {
    line("gpus", &gpus());
    line("isolation", &isolation());
    line("worker", &worker());
    line("python", &python());
    line("slurm", &slurm());
    line("disk", &disk(Path::new("runs")));
    ExitCode::SUCCESS
}

fn line(area: &str, text: &str) {
    println!("{area:<10} {text}");
}

/// NVML's view: the driver and each GPU, or why there is none.
fn gpus() -> String {
    match orchestrator::gpu::discover() {
        Inventory::Available { gpus, driver, .. } if gpus.is_empty() => format!(
            "NVIDIA driver {driver}, but NVML lists no GPU: stages run on the CPU (check `nvidia-smi`)"
        ),
        Inventory::Available { gpus, driver, .. } => {
            let list: Vec<String> = gpus
                .iter()
                .map(|g| format!("{} {} ({} MiB)", g.index, g.name, g.total_bytes >> 20))
                .collect();
            format!("NVIDIA driver {driver}, {} GPU(s): {}", gpus.len(), list.join(", "))
        }
        Inventory::Unavailable(NvmlUnavailable::NoDriver) => format!(
            "{}; fix: install the NVIDIA driver (it brings libnvidia-ml.so.1) to run stages on GPUs",
            orchestrator::gpu::NO_DRIVER_NOTE
        ),
        Inventory::Unavailable(why) => {
            format!("{why}: stages run on the CPU and GPU checks are off; fix: check `nvidia-smi`")
        }
    }
}

/// cgroup v2 and which limits, and where stage cgroups nest inside a Slurm job.
fn isolation() -> String {
    let host = HostCgroups::detect(&orchestrator::settings::Settings::from_env());
    let mut text = host.describe();
    if host.usable() {
        text.push_str(&format!(
            "; cgroup namespaces: {}",
            host.describe_namespaces()
        ));
    }
    if orchestrator::slurm::Allocation::detect().is_some() {
        let own = host
            .own
            .as_ref()
            .map_or("none".to_string(), |p| p.display().to_string());
        text.push_str(&format!(
            "; inside a Slurm job: stage cgroups nest under the job's own ({own})"
        ));
    }
    text
}

/// The built-in worker: where it is and whether its libtorch loads.
fn worker() -> String {
    let beside = match worker_binary::beside_this_executable() {
        Ok(p) => p,
        Err(e) => return format!("cannot find this executable's path: {e}"),
    };
    let Some(path) = std::env::var_os("ORCHESTRATE_WORKER")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| worker_binary::find_installed(&beside))
    else {
        return format!(
            "no stage-worker beside this orchestrate or on PATH: built-in stages (`kind`) are refused, command stages run; fix: {}",
            worker_binary::HOW_TO_GET_ONE
        );
    };
    if is_launcher_script(&path) {
        return format!(
            "{}, a launcher (the orchestrate-worker wheel's: libtorch from its environment's torch)",
            path.display()
        );
    }
    match Command::new("ldd").arg(&path).output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let missing: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("not found"))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            let torch = text
                .lines()
                .find(|l| l.contains("libtorch_cpu"))
                .and_then(|l| l.split("=>").nth(1))
                .and_then(|r| r.split_whitespace().next())
                .map(|p| {
                    Path::new(p)
                        .parent()
                        .unwrap_or(Path::new(p))
                        .display()
                        .to_string()
                });
            if !missing.is_empty() {
                format!(
                    "{} cannot load {}; fix: put libtorch 2.11's lib/ on LD_LIBRARY_PATH (scripts/setup-libtorch installs it into .libtorch/)",
                    path.display(),
                    missing.join(", ")
                )
            } else {
                format!(
                    "{}, libtorch from {}",
                    path.display(),
                    torch.unwrap_or_else(|| "its own build".into())
                )
            }
        }
        Err(_) => format!(
            "{} (ldd not found: its libraries unchecked)",
            path.display()
        ),
    }
}

/// Whether `path` is a script (`#!`), as the orchestrate-worker wheel's `stage-worker` is,
/// rather than the binary itself (which `ldd` can check).
fn is_launcher_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"#!")
}

/// What `python3` on PATH offers: its version, the helper, and the frameworks it would import.
const PROBE: &str = r#"
import importlib.util as u, importlib.metadata as m, sys
def v(d):
    try: return m.version(d)
    except Exception: return "?"
print("Python %d.%d.%d" % sys.version_info[:3])
print("helper" if u.find_spec("orchestrate_stage") else "no-helper")
for mod, dist in [("torch","torch"),("transformers","transformers"),("accelerate","accelerate"),("lightning","lightning"),("deepspeed","deepspeed")]:
    if u.find_spec(mod): print("%s %s" % (mod, v(dist)))
"#;

fn python() -> String {
    let out = match Command::new("python3").args(["-c", PROBE]).output() {
        Ok(out) if out.status.success() => out,
        _ => {
            return "no python3 on PATH: Python stages need one; fix: install Python 3.8 or later"
                .into()
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let version = lines.next().unwrap_or("Python ?");
    let helper = match lines.next() {
        Some("helper") => "orchestrate_stage importable".to_string(),
        _ => "orchestrate_stage missing (stages cannot report progress or checkpoints); fix: `pip install orchestrate` (the wheel) or `pip install ./python`".to_string(),
    };
    let frameworks: Vec<&str> = lines.collect();
    let frameworks = if frameworks.is_empty() {
        "no torch, transformers, accelerate, lightning or deepspeed".to_string()
    } else {
        frameworks.join(", ")
    };
    format!("{version}; {helper}; {frameworks}")
}

/// Whether this is a Slurm job, or Slurm's commands are here.
fn slurm() -> String {
    if let Some(job) = orchestrator::slurm::Allocation::detect() {
        return job.describe();
    }
    match worker_binary::on_path("sbatch") {
        Some(p) => format!(
            "{} found, not inside a job: configs/slurm/*.sbatch submit plans",
            p.display()
        ),
        None => "not installed (needed only to run plans as Slurm jobs; docs/slurm.md)".into(),
    }
}

/// Free space where runs are written by default (`runs/` here, else the current directory).
fn disk(runs: &Path) -> String {
    let at = if runs.is_dir() { runs } else { Path::new(".") };
    match nix::sys::statvfs::statvfs(at) {
        Ok(s) => {
            let free = s.blocks_available() * s.fragment_size();
            let total = s.blocks() * s.fragment_size();
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            let warn = if free < 10 << 30 {
                "; under 10 GiB: checkpoints may not fit, choose another --run-dir"
            } else {
                ""
            };
            format!(
                "{:.1} GiB free of {:.1} GiB where runs go ({}){warn}",
                gib(free),
                gib(total),
                std::fs::canonicalize(at)
                    .unwrap_or_else(|_| at.to_path_buf())
                    .display()
            )
        }
        Err(e) => format!("cannot read free space of {}: {e}", at.display()),
    }
}

//! Links the stage worker against the libtorch that `scripts/setup-libtorch` installs.
//!
//! Two things the tch crate leaves to us (tch-rs issues 907 and 980):
//! - `libtorch_cuda` is dropped by the linker's `--as-needed` because no symbol of it is used
//!   directly, so CUDA would never be available; `--no-as-needed` keeps it when it exists.
//! - an rpath to the libtorch the binary was built against, so it runs without
//!   `LD_LIBRARY_PATH`. (`LD_LIBRARY_PATH` still wins, which is how the binary runs on a host
//!   whose own PyTorch 2.11 provides libtorch.)
//!
//! It also compiles the C++ under `csrc/` that reaches libtorch where tch does not: libtorch's
//! fused AdamW over per-parameter lists (`fused_adamw.cpp`, for `src/model/optim.rs`), the
//! choice of attention kernels (`attention.cpp`, `src/model/attention.rs`), libtorch's profiler
//! (`profiler.cpp`, `src/stages/profile.rs`), and the worker's own CUDA kernels: their source
//! `kernels.cu`, which is written into `$OUT_DIR/kernels_cu.inc` as one raw string literal and
//! compiled at run time by NVRTC (`kernel_module.cpp`, no CUDA toolkit needed here), and their
//! autograd functions and entry points (`fused.cpp`, `src/kernels/fused.rs`). `kernels.cu` is
//! also compiled for the host (`kernels_host.cpp`: the Llama block's element-wise kernels run
//! on CPU tensors, so the CPU tests exercise them), and the host check `csrc/emulate/run.sh`
//! compiles it directly for the CPU.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        panic!(
            "\n\nLIBTORCH is not set. Run `scripts/setup-libtorch` from the repository root \
             (it installs libtorch 2.11.0 into .libtorch/ and .cargo/config.toml points the build at it).\n"
        );
    };
    let lib = PathBuf::from(&libtorch).join("lib");
    if !lib.join("libtorch_cpu.so").exists() {
        panic!(
            "\n\nlibtorch was not found at {}. Run `scripts/setup-libtorch` from the repository \
             root to install libtorch 2.11.0 there (once, a few minutes).\n",
            lib.display()
        );
    }
    println!("cargo:rerun-if-changed=csrc/fused_adamw.cpp");
    println!("cargo:rerun-if-changed=csrc/attention.cpp");
    println!("cargo:rerun-if-changed=csrc/profiler.cpp");
    println!("cargo:rerun-if-changed=csrc/fused.cpp");
    println!("cargo:rerun-if-changed=csrc/kernel_module.cpp");
    println!("cargo:rerun-if-changed=csrc/kernel_module.h");
    println!("cargo:rerun-if-changed=csrc/kernels_host.cpp");
    println!("cargo:rerun-if-changed=csrc/kernels_host.h");
    println!("cargo:rerun-if-changed=csrc/kernels.cu");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    embed_cuda_source(&out);
    let include = PathBuf::from(&libtorch).join("include");
    cc::Build::new()
        .cpp(true)
        .file("csrc/fused_adamw.cpp")
        .file("csrc/attention.cpp")
        .file("csrc/profiler.cpp")
        .file("csrc/fused.cpp")
        .file("csrc/kernel_module.cpp")
        .file("csrc/kernels_host.cpp")
        .include("csrc")
        .include(&out)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .warnings(false)
        .compile("stage_worker_fused_adamw");
    println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg-bins=-ltorch_cuda");
        println!("cargo:rustc-link-arg-bins=-Wl,--as-needed");
    }
}

/// Writes `csrc/kernels.cu` as one C++ raw string literal into `out/kernels_cu.inc`, which
/// `kernel_module.cpp` includes as the source it hands NVRTC.
fn embed_cuda_source(out: &std::path::Path) {
    let source = std::fs::read_to_string("csrc/kernels.cu").expect("csrc/kernels.cu is readable");
    assert!(
        !source.contains(")CUDA\""),
        "csrc/kernels.cu must not contain the raw string's end `)CUDA\"`"
    );
    let literal = format!("R\"CUDA({source})CUDA\"\n");
    std::fs::write(out.join("kernels_cu.inc"), literal).expect("OUT_DIR is writable");
}

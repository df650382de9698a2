//! Links the stage worker against the libtorch that `scripts/setup-libtorch` installs.
//!
//! Two things the tch crate leaves to us (tch-rs issues 907 and 980):
//! - `libtorch_cuda` is dropped by the linker's `--as-needed` because no symbol of it is used
//!   directly, so CUDA would never be available; `--no-as-needed` keeps it when it exists.
//! - an rpath to the libtorch the binary was built against, so it runs without
//!   `LD_LIBRARY_PATH`. (`LD_LIBRARY_PATH` still wins, which is how the binary runs on a host
//!   whose own PyTorch 2.11 provides libtorch.)
//!
//! It also compiles the few lines of C++ under `csrc/` that reach libtorch where tch does not:
//! the fused AdamW kernel (`src/optim.rs`), the choice of attention kernels
//! (`src/attention.rs`), libtorch's profiler (`src/profile.rs`) and the fused kernels with
//! their autograd functions (`src/fused.rs`).

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
    let include = PathBuf::from(&libtorch).join("include");
    cc::Build::new()
        .cpp(true)
        .file("csrc/fused_adamw.cpp")
        .file("csrc/attention.cpp")
        .file("csrc/profiler.cpp")
        .file("csrc/fused.cpp")
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

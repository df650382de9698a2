//! The end-to-end tests: one test binary (`e2e`, so one link step), one module per area, each
//! driving the real `orchestrate` and `stage-worker` binaries (built first by
//! `cargo build --bins`, see [`e2e_tests::bin_dir`]).
//!
//! Run one area with a filter on its module path, for instance
//! `cargo nextest run -p e2e-tests -E 'test(/^slurm::/)'` (or `cargo test -p e2e-tests --test e2e
//! slurm::`). The helpers the areas share are in the `e2e_tests` library (`tests/src`).

mod cgroups;
mod chain;
mod command_stages;
mod console_tty;
mod daemon;
mod daemon_events;
mod daemon_requests;
mod daemon_restart;
mod early_start;
mod fork_server;
mod frameworks;
mod gpu_handout;
mod gpu_health;
mod gpu_queue;
mod gpu_sharing;
mod handover;
mod hangs;
mod hostile_inputs;
mod install;
mod leaks_visible;
mod llama_quickstart;
mod logs;
mod matrix;
mod pipeline;
mod python_stage;
mod rank_failure;
mod release;
mod resume;
mod retries;
mod rundir;
mod signals;
mod slots;
mod slurm;
mod timeout_stall;
mod tracking;
mod validate_cli;
mod web;
mod web_connections;
mod zygote;

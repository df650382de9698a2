//! Which kernels compute attention on a CUDA device.
//!
//! libtorch 2.11 answers the model's attention (bf16, causal, head size 64, on an H200) with
//! cuDNN's kernels when it may. Their first forward + backward in a fresh process took 0.16 s
//! (cuDNN loads and plans them), against 0.005–0.008 s for PyTorch's own memory-efficient or
//! flash kernels; a second call took 9–14 ms in each of the three (single calls,
//! `bench/boundary/results/2026-11-30-h200-attention-probe/`), and 60 whole training steps of the
//! 100M model 1.11 s without cuDNN against 1.24 s with it (one chain each, docs/boundary.md §5).
//! Since every stage is a fresh
//! process, that first use is paid at every stage boundary. In steady training cuDNN's kernels
//! are faster: 1.13 ms of attention per 100M step against 1.90 ms for the memory-efficient ones
//! (profiles of one H200, `bench/throughput/results/2026-12-01-h200-probe1/`), so they repay
//! their first use after about 200 steps. `STAGE_WORKER_SDPA` chooses: `auto` (the default:
//! libtorch's own choice, cuDNN included, for a stage that plans at least
//! [`CUDNN_FROM_STEPS`] steps, else `efficient`), `efficient` (memory-efficient kernels, then
//! the plain math ones for shapes they cannot take), `flash` (flash, then memory-efficient,
//! then math), or `libtorch` (libtorch's own choice, cuDNN included).

/// The fewest planned steps for which `auto` lets libtorch use cuDNN's attention: its first
/// use (0.16 s) divided by what it saves per step at 100M parameters (0.77 ms), rounded up.
/// Larger models save more per step, so this errs towards the kernels that start fast.
pub const CUDNN_FROM_STEPS: u64 = 200;

/// A choice of attention kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Chosen by the stage's length (see [`Kernels::for_steps`]).
    Auto,
    /// Memory-efficient attention, else math.
    Efficient,
    /// Flash attention, else memory-efficient, else math.
    Flash,
    /// Whatever libtorch picks (cuDNN first where it applies).
    Libtorch,
}

impl Kernels {
    /// The choice `STAGE_WORKER_SDPA` names (`auto` when unset); `None` for a value it does
    /// not know.
    pub fn from_env() -> Option<Kernels> {
        match std::env::var("STAGE_WORKER_SDPA").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Some(Kernels::Auto),
            Ok("efficient") => Some(Kernels::Efficient),
            Ok("flash") => Some(Kernels::Flash),
            Ok("libtorch") => Some(Kernels::Libtorch),
            Ok(_) => None,
        }
    }

    /// The kernels for a stage that plans `steps` steps: `Auto` becomes `Libtorch` from
    /// [`CUDNN_FROM_STEPS`] steps and `Efficient` below; any other choice stays.
    pub fn for_steps(self, steps: u64) -> Kernels {
        match self {
            Kernels::Auto if steps >= CUDNN_FROM_STEPS => Kernels::Libtorch,
            Kernels::Auto => Kernels::Efficient,
            chosen => chosen,
        }
    }
}

extern "C" {
    /// `csrc/attention.cpp`: sets libtorch's four attention switches.
    fn stage_worker_sdp_backends(flash: bool, mem_efficient: bool, math: bool, cudnn: bool);
}

/// Applies `kernels` to this process (all threads): call before the first attention on a CUDA
/// device (`Auto` applies `Efficient`; a stage that knows its length applies
/// [`Kernels::for_steps`] again). The CPU's attention is not affected (a stage on the CPU never
/// calls this).
pub fn apply(kernels: Kernels) {
    let (flash, efficient, cudnn) = match kernels {
        Kernels::Auto | Kernels::Efficient => (false, true, false),
        Kernels::Flash => (true, true, false),
        Kernels::Libtorch => (true, true, true),
    };
    // SAFETY: sets four flags of libtorch's global context; no pointers, no failure.
    unsafe { stage_worker_sdp_backends(flash, efficient, true, cudnn) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_the_kernels() {
        // One test touches the variable, so parallel tests do not race on it.
        for (value, want) in [
            (None, Some(Kernels::Auto)),
            (Some("auto"), Some(Kernels::Auto)),
            (Some("efficient"), Some(Kernels::Efficient)),
            (Some("flash"), Some(Kernels::Flash)),
            (Some("libtorch"), Some(Kernels::Libtorch)),
            (Some("cudnn!"), None),
        ] {
            match value {
                Some(v) => std::env::set_var("STAGE_WORKER_SDPA", v),
                None => std::env::remove_var("STAGE_WORKER_SDPA"),
            }
            assert_eq!(Kernels::from_env(), want, "{value:?}");
        }
        std::env::remove_var("STAGE_WORKER_SDPA");
    }

    #[test]
    fn auto_takes_cudnn_only_for_a_stage_long_enough_to_repay_its_first_use() {
        assert_eq!(
            Kernels::Auto.for_steps(CUDNN_FROM_STEPS - 1),
            Kernels::Efficient
        );
        assert_eq!(Kernels::Auto.for_steps(CUDNN_FROM_STEPS), Kernels::Libtorch);
        for chosen in [Kernels::Efficient, Kernels::Flash, Kernels::Libtorch] {
            assert_eq!(chosen.for_steps(10), chosen);
            assert_eq!(chosen.for_steps(100_000), chosen);
        }
    }
}

//! The worker's own CUDA kernels (`csrc/kernels.cu`, compiled at run time by NVRTC) as
//! autograd operations and an AdamW step ([`fused`]), and `stage-worker check-kernels`, which
//! compares them with libtorch's on a GPU ([`check`]).

pub mod check;
pub mod fused;

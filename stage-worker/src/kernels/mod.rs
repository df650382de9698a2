//! The worker's own CUDA kernels (`csrc/kernels.cu`, compiled at run time by NVRTC) as
//! autograd operations and an AdamW step ([`fused`]). `stage-worker check-kernels` compares them
//! with libtorch's on a GPU; it runs the model too, so it is kept with the stages, not here.

pub mod fused;

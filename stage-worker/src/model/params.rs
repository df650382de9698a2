//! The model's parameters: named fp32 tensors that all live in one flat buffer.
//!
//! Each parameter is a leaf tensor (it gets its own `.grad`) that shares storage with a slice
//! of [`ParamStore::flat`], so the optimizer updates every parameter with a handful of whole-
//! buffer operations instead of a dozen small ones per parameter.

use std::sync::Mutex;
use tch::{Device, Kind, Tensor};

/// Serialises use of torch's global CPU generator (seed, then draw).
static TORCH_RNG: Mutex<()> = Mutex::new(());

/// One named parameter.
pub struct Param {
    /// Name in checkpoints, such as `blocks.0.attn.qkv.weight`.
    pub name: String,
    /// Shape.
    pub shape: Vec<i64>,
    /// Offset of its first element in the flat buffer.
    pub offset: i64,
    /// Element count.
    pub numel: i64,
    /// The leaf tensor used in the forward pass (a view of the flat buffer).
    pub tensor: Tensor,
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
    /// All ones.
    Ones,
    /// All zeros.
    Zeros,
}

/// Builder: declare parameters in order, then [`ParamSpecs::build`].
#[derive(Default)]
pub struct ParamSpecs {
    specs: Vec<ParamSpec>,
}

/// One declared parameter.
struct ParamSpec {
    name: String,
    shape: Vec<i64>,
    init: Init,
    decay: bool,
}

impl ParamSpecs {
    /// Declares a parameter; `decay` says whether weight decay applies to it.
    pub fn add(&mut self, name: impl Into<String>, shape: &[i64], init: Init, decay: bool) {
        self.specs.push(ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            decay,
        });
    }

    /// Allocates the parameters on `device` and initialises them from `seed`. On the CPU,
    /// values are drawn from torch's CPU generator; on a CUDA device they are drawn on the
    /// device itself from its generator (no host-side draw, no copies: building a large model
    /// takes milliseconds). Either generator is seeded and held under a lock for the whole
    /// draw, so a seed gives the same weights on every run on the same kind of device,
    /// whatever other threads do (CPU and CUDA draws differ from each other). In the flat
    /// buffer the decayed parameters come first, so decay is one operation on a prefix.
    pub fn build(self, device: Device, seed: u64) -> ParamStore {
        self.build_inner(device, Some(seed))
    }

    /// Allocates the parameters on `device`, all zero.
    pub fn build_zeroed(self, device: Device) -> ParamStore {
        self.build_inner(device, None)
    }

    fn build_inner(self, device: Device, seed: Option<u64>) -> ParamStore {
        // Layout: decayed parameters first, each group in declaration order.
        let mut order: Vec<usize> = (0..self.specs.len()).collect();
        order.sort_by_key(|&i| (!self.specs[i].decay, i));
        let numel = |spec: &ParamSpec| spec.shape.iter().product::<i64>();
        let mut offsets = vec![0i64; self.specs.len()];
        let mut offset = 0;
        let mut decay_len = 0;
        for &i in &order {
            offsets[i] = offset;
            offset += numel(&self.specs[i]);
            if self.specs[i].decay {
                decay_len = offset;
            }
        }
        // The device buffer first: a model too large for the device fails here, at once.
        let flat = Tensor::zeros([offset], (Kind::Float, device));
        tch::no_grad(|| {
            let Some(seed) = seed else { return };
            let _rng = TORCH_RNG.lock().unwrap_or_else(|e| e.into_inner());
            if device.is_cuda() {
                tch::Cuda::manual_seed(seed);
                for (spec, &at) in self.specs.iter().zip(&offsets) {
                    let mut dst = flat.narrow(0, at, numel(spec));
                    match spec.init {
                        Init::Normal(std) => {
                            let _ = dst.normal_(0.0, std);
                        }
                        Init::Ones => {
                            let _ = dst.fill_(1.0);
                        }
                        Init::Zeros => {}
                    }
                }
                return;
            }
            tch::manual_seed(seed as i64);
            let cpu = (Kind::Float, Device::Cpu);
            for (spec, &at) in self.specs.iter().zip(&offsets) {
                let values = match spec.init {
                    Init::Normal(std) => Tensor::randn(&spec.shape, cpu) * std,
                    Init::Ones => Tensor::ones(&spec.shape, cpu),
                    Init::Zeros => Tensor::zeros(&spec.shape, cpu),
                };
                let mut dst = flat.narrow(0, at, numel(spec)).view(spec.shape.as_slice());
                dst.copy_(&values);
            }
        });
        let mut specs: Vec<Option<ParamSpec>> = self.specs.into_iter().map(Some).collect();
        let params = order
            .iter()
            .map(|&i| {
                let spec = specs[i].take().expect("each parameter is laid out once");
                let n = numel(&spec);
                let tensor = flat
                    .narrow(0, offsets[i], n)
                    .view(spec.shape.as_slice())
                    .detach()
                    .set_requires_grad(true);
                Param {
                    name: spec.name,
                    shape: spec.shape,
                    offset: offsets[i],
                    numel: n,
                    tensor,
                }
            })
            .collect();
        ParamStore {
            flat,
            params,
            decay_len,
        }
    }
}

/// All parameters of a model.
pub struct ParamStore {
    /// Every parameter's values (fp32), concatenated in the order of [`Self::params`].
    pub flat: Tensor,
    /// The parameters in buffer order: those with weight decay first, then the rest, each
    /// group in declaration order.
    pub params: Vec<Param>,
    /// Length of the prefix of [`Self::flat`] that weight decay applies to.
    pub decay_len: i64,
}

impl ParamStore {
    /// The parameter called `name`. Panics if there is none (a programming error).
    pub fn get(&self, name: &str) -> &Tensor {
        &self
            .params
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no parameter {name}"))
            .tensor
    }

    /// Total number of scalars.
    pub fn numel(&self) -> i64 {
        self.flat.numel() as i64
    }

    /// Device of the parameters.
    pub fn device(&self) -> Device {
        self.flat.device()
    }

    /// Every parameter's gradient, flattened and concatenated in the order of [`Self::flat`]
    /// (zeros for a parameter that got none). The reference AdamW of the optimizer's tests.
    #[cfg(test)]
    pub fn flat_grad(&self) -> Tensor {
        let grads: Vec<Tensor> = self
            .params
            .iter()
            .map(|p| {
                let g = p.tensor.grad();
                if g.defined() {
                    g.reshape([-1])
                } else {
                    Tensor::zeros([p.numel], (Kind::Float, self.device()))
                }
            })
            .collect();
        Tensor::cat(&grads, 0)
    }

    /// The parameters as the worker's AdamW kernels take them
    /// ([`crate::kernels::fused::adamw_step`]): the flat buffer, each leaf with its offset, and
    /// the decayed prefix's length.
    pub fn flat_params(&self) -> crate::kernels::fused::FlatParams<'_> {
        crate::kernels::fused::FlatParams {
            flat: &self.flat,
            leaves: self.params.iter().map(|p| (&p.tensor, p.offset)).collect(),
            decay_len: self.decay_len,
        }
    }

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.tensor.zero_grad();
        }
    }

    /// Replaces every parameter's values from `tensors`, which must hold exactly these names
    /// with these shapes (any kind convertible to fp32). The error says which name is missing,
    /// unexpected or misshapen.
    pub fn load(&self, tensors: &[(String, Tensor)], what: &str) -> Result<(), String> {
        load_slices(&self.flat, &self.params, tensors, "", what)
    }
}

/// Named CPU copies of the slices of `flat` that `params` describe, names prefixed (tests).
#[cfg(test)]
pub fn slices_cpu(flat: &Tensor, params: &[Param], prefix: &str) -> Vec<(String, Tensor)> {
    tch::no_grad(|| {
        params
            .iter()
            .map(|p| {
                let t = flat
                    .narrow(0, p.offset, p.numel)
                    .view(p.shape.as_slice())
                    .to_device(Device::Cpu)
                    .contiguous();
                (format!("{prefix}{}", p.name), t)
            })
            .collect()
    })
}

/// Fills the slices of `flat` that `params` describe from `tensors` (names prefixed), checking
/// that the names match exactly and every shape agrees.
pub fn load_slices(
    flat: &Tensor,
    params: &[Param],
    tensors: &[(String, Tensor)],
    prefix: &str,
    what: &str,
) -> Result<(), String> {
    for (name, _) in tensors {
        let known = name
            .strip_prefix(prefix)
            .is_some_and(|n| params.iter().any(|p| p.name == n));
        if !known {
            return Err(format!(
                "{what} has a tensor `{name}` this model does not have"
            ));
        }
    }
    tch::no_grad(|| {
        for p in params {
            let full = format!("{prefix}{}", p.name);
            let Some((_, t)) = tensors.iter().find(|(n, _)| *n == full) else {
                return Err(format!("{what} lacks the tensor `{full}`"));
            };
            if t.size() != p.shape {
                return Err(format!(
                    "{what}: tensor `{full}` has shape {:?}, the model needs {:?}",
                    t.size(),
                    p.shape
                ));
            }
            let mut dst = flat.narrow(0, p.offset, p.numel).view(p.shape.as_slice());
            dst.copy_(&t.to_kind(Kind::Float));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decayed_parameters_form_a_prefix_and_share_storage() {
        crate::testutil::one_torch_thread();
        let mut specs = ParamSpecs::default();
        specs.add("a", &[2, 3], Init::Normal(1.0), true);
        specs.add("b", &[4], Init::Ones, false);
        specs.add("c", &[5], Init::Normal(1.0), true);
        let mut store = specs.build(Device::Cpu, 7);
        let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "c", "b"]);
        assert_eq!(store.decay_len, 11);
        assert_eq!(store.params[2].offset, 11);
        assert!(store
            .get("b")
            .equal(&Tensor::ones([4], (Kind::Float, Device::Cpu))));
        // Writing the flat buffer changes the parameters the model reads.
        tch::no_grad(|| store.flat *= 2.0);
        assert_eq!(store.get("b").double_value(&[0]), 2.0);
        // Gradients of the leaves come back in buffer order.
        (store.get("a").sum(Kind::Float) + store.get("b").sum(Kind::Float) * 3.0).backward();
        let g = Vec::<f32>::try_from(&store.flat_grad()).unwrap();
        assert_eq!(g[..6], [1.0; 6]);
        assert_eq!(g[6..11], [0.0; 5]);
        assert_eq!(g[11..], [3.0; 4]);
    }
}

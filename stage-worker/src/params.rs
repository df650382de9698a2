//! The model's parameters: named fp32 tensors that all live in one flat buffer.
//!
//! Each parameter is a leaf tensor (it gets its own `.grad`) that shares storage with a slice
//! of [`ParamStore::flat`], so the optimizer updates every parameter with a handful of whole-
//! buffer operations instead of a dozen small ones per parameter.

use crate::rng::Rng;
use tch::{Device, Kind, Tensor};

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
    /// Whether weight decay applies (matrices and embeddings, not biases or norms).
    pub decay: bool,
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
    specs: Vec<(String, Vec<i64>, Init, bool)>,
}

impl ParamSpecs {
    /// Declares a parameter; `decay` says whether weight decay applies to it.
    pub fn add(&mut self, name: impl Into<String>, shape: &[i64], init: Init, decay: bool) {
        self.specs.push((name.into(), shape.to_vec(), init, decay));
    }

    /// Allocates the parameters on `device` and initialises them from `seed` with this crate's
    /// own generator, so a seed gives the same weights on every device and in every thread.
    pub fn build(self, device: Device, seed: u64) -> ParamStore {
        let mut rng = Rng::for_stream(seed, 0x1417);
        let total: i64 = self
            .specs
            .iter()
            .map(|(_, s, _, _)| s.iter().product::<i64>())
            .sum();
        let flat = Tensor::zeros([total], (Kind::Float, device));
        let mut params = Vec::with_capacity(self.specs.len());
        let mut offset = 0;
        tch::no_grad(|| {
            for (name, shape, init, decay) in self.specs {
                let numel: i64 = shape.iter().product();
                let values = match init {
                    Init::Normal(std) => {
                        let v: Vec<f32> = (0..numel).map(|_| (rng.normal() * std) as f32).collect();
                        Tensor::from_slice(&v).view(shape.as_slice())
                    }
                    Init::Ones => Tensor::ones(&shape, (Kind::Float, Device::Cpu)),
                    Init::Zeros => Tensor::zeros(&shape, (Kind::Float, Device::Cpu)),
                };
                let slot = flat.narrow(0, offset, numel);
                let mut dst = slot.view(shape.as_slice());
                dst.copy_(&values);
                let tensor = slot.view(shape.as_slice()).detach().set_requires_grad(true);
                params.push(Param {
                    name,
                    shape,
                    offset,
                    numel,
                    decay,
                    tensor,
                });
                offset += numel;
            }
        });
        ParamStore { flat, params }
    }
}

/// All parameters of a model.
pub struct ParamStore {
    /// Every parameter's values, concatenated in declaration order (fp32).
    pub flat: Tensor,
    /// The parameters, in declaration order.
    pub params: Vec<Param>,
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
    /// (zeros for a parameter that got none).
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

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.tensor.zero_grad();
        }
    }

    /// A flat mask with 1.0 where weight decay applies and 0.0 elsewhere.
    pub fn decay_mask(&self) -> Tensor {
        let mask = Tensor::zeros([self.numel()], (Kind::Float, self.device()));
        tch::no_grad(|| {
            for p in self.params.iter().filter(|p| p.decay) {
                let mut slot = mask.narrow(0, p.offset, p.numel);
                let _ = slot.fill_(1.0);
            }
        });
        mask
    }

    /// Named CPU copies of the parameters, for saving.
    pub fn named_cpu(&self) -> Vec<(String, Tensor)> {
        slices_cpu(&self.flat, &self.params, "")
    }

    /// Replaces every parameter's values from `tensors`, which must hold exactly these names
    /// with these shapes (any kind convertible to fp32). The error says which name is missing,
    /// unexpected or misshapen.
    pub fn load(&self, tensors: &[(String, Tensor)], what: &str) -> Result<(), String> {
        load_slices(&self.flat, &self.params, tensors, "", what)
    }
}

/// Named CPU copies of the slices of `flat` that `params` describe, names prefixed.
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

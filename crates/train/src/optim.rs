//! Optimizers as graph pieces: each parameter's update written with the op set's own ops, so
//! the reference interpreter defines its bits like any graph's (docs/TRAINING.md spells the
//! formulas and their order out).

use tenet_ir::Tensor;

/// An optimizer and its hyperparameters (part of the step graph, hence of its id).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `v ← μ·v + (g + λ·p)`; `p ← p − η·v`.
    Sgd {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    },
    /// Adam with decoupled weight decay: `m ← β₁·m + (1−β₁)·g`; `v ← β₂·v + (1−β₂)·g²`;
    /// `p ← p − η·((m / (1−β₁ᵗ)) / (sqrt(v / (1−β₂ᵗ)) + ε) + λ·p)`, `t` the 1-based step.
    AdamW {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    },
}

impl Optimizer {
    pub fn sgd(lr: f32) -> Optimizer {
        Optimizer::Sgd {
            lr,
            momentum: 0.9,
            weight_decay: 0.0,
        }
    }

    pub fn adamw(lr: f32) -> Optimizer {
        Optimizer::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// The optimizer `name` (`adamw` or `sgd`) with learning rate `lr`, or the default for
    /// `dataset` (AdamW 1e-3 on MNIST, 5e-4 otherwise; SGD 0.05): the one place `tenet train`,
    /// the coordinator and Python take their defaults from. `None` for another name.
    pub fn by_name(name: &str, lr: Option<f32>, dataset: &str) -> Option<Optimizer> {
        let mnist = dataset == "mnist";
        match name {
            "adamw" => Some(Optimizer::adamw(lr.unwrap_or(if mnist {
                1e-3
            } else {
                5e-4
            }))),
            "sgd" => Some(Optimizer::sgd(lr.unwrap_or(0.05))),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::AdamW { .. } => "adamw",
        }
    }

    /// The state each parameter carries, by slot name (zeros at the start).
    pub fn slots(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { .. } => &["momentum"],
            Optimizer::AdamW { .. } => &["m", "v"],
        }
    }

    /// A one-line description with every hyperparameter (checkpoints record it).
    pub fn describe(&self) -> String {
        match *self {
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => format!("sgd lr={lr} momentum={momentum} weight_decay={weight_decay}"),
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => format!(
                "adamw lr={lr} beta1={beta1} beta2={beta2} eps={eps} weight_decay={weight_decay}"
            ),
        }
    }

    /// The updated parameter and state (in `slots` order) from the parameter `p`, its
    /// gradient `g`, its state and the 1-based step `t` (an f32 scalar).
    pub fn update(
        &self,
        p: &Tensor,
        g: &Tensor,
        state: &[Tensor],
        t: &Tensor,
    ) -> (Tensor, Vec<Tensor>) {
        match *self {
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => {
                let g = if weight_decay != 0.0 {
                    g + &(p * weight_decay as f64)
                } else {
                    g.clone()
                };
                let v = &state[0] * momentum as f64 + g;
                let p = p - &(&v * lr as f64);
                (p, vec![v])
            }
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let b = p.builder();
                let scalar = |v: f32| b.scalar(tenet_ir::DType::F32, v as f64);
                let m = &state[0] * beta1 as f64 + g * (1.0 - beta1 as f64);
                let v = &state[1] * beta2 as f64 + (g * g) * (1.0 - beta2 as f64);
                let m_hat = &m / &(1.0 - &scalar(beta1).pow(t));
                let v_hat = &v / &(1.0 - &scalar(beta2).pow(t));
                let step = m_hat / (v_hat.sqrt() + eps as f64);
                let step = if weight_decay != 0.0 {
                    step + p * weight_decay as f64
                } else {
                    step
                };
                let p = p - &(step * lr as f64);
                (p, vec![m, v])
            }
        }
    }
}

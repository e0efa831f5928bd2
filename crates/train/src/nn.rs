//! Layers and the bundled models, written with the graph builder: a model is a list of named
//! parameters (with how each starts) and a forward function from those parameters and a batch
//! of images `[B, C, H, W]` to logits `[B, classes]`.

use std::collections::HashMap;

use tenet_ir::Tensor;

/// How a parameter starts (`init.rs` turns this into a graph of `random_normal` ops).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// He (Kaiming) normal: `N(0, 1) · sqrt(2 / fan_in)`, for weights feeding a ReLU.
    HeNormal { fan_in: u64 },
    /// All zeros (biases).
    Zeros,
}

/// One trainable tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<u64>,
    pub init: Init,
}

/// The bundled architectures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Flatten, one hidden layer of 256 ReLUs, a linear layer to the classes.
    Mlp,
    /// Two 3×3 convolutions (16 and 32 channels, padding 1), each with a ReLU and a 2×2 max
    /// pool, then a linear layer of 128 ReLUs and one to the classes.
    Cnn,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
        }
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        [Arch::Mlp, Arch::Cnn]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// An architecture fitted to a dataset's sample shape and class count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub arch: Arch,
    /// `[C, H, W]` of one sample.
    pub input: Vec<u64>,
    pub classes: u64,
}

const MLP_HIDDEN: u64 = 512;
const CNN_CHANNELS: [u64; 2] = [16, 32];
const CNN_HIDDEN: u64 = 128;

impl Model {
    pub fn new(arch: Arch, input: &[u64], classes: u64) -> Model {
        Model {
            arch,
            input: input.to_vec(),
            classes,
        }
    }

    fn features(&self) -> u64 {
        self.input.iter().product()
    }

    /// `[C, H, W]` after the CNN's two conv + pool blocks.
    fn cnn_flat(&self) -> u64 {
        let (mut h, mut w) = (self.input[1], self.input[2]);
        for _ in 0..2 {
            h /= 2;
            w /= 2;
        }
        CNN_CHANNELS[1] * h * w
    }

    /// The parameters in a fixed order (their order is part of a checkpoint's meaning only
    /// through their names).
    pub fn params(&self) -> Vec<ParamSpec> {
        let mut p = Vec::new();
        let linear = |p: &mut Vec<ParamSpec>, name: &str, fan_in: u64, out: u64| {
            p.push(ParamSpec {
                name: format!("{name}.weight"),
                shape: vec![fan_in, out],
                init: Init::HeNormal { fan_in },
            });
            p.push(ParamSpec {
                name: format!("{name}.bias"),
                shape: vec![out],
                init: Init::Zeros,
            });
        };
        match self.arch {
            Arch::Mlp => {
                linear(&mut p, "fc1", self.features(), MLP_HIDDEN);
                linear(&mut p, "fc2", MLP_HIDDEN, self.classes);
            }
            Arch::Cnn => {
                let mut channels = self.input[0];
                for (i, &out) in CNN_CHANNELS.iter().enumerate() {
                    let fan_in = channels * 9;
                    p.push(ParamSpec {
                        name: format!("conv{}.weight", i + 1),
                        shape: vec![out, channels, 3, 3],
                        init: Init::HeNormal { fan_in },
                    });
                    p.push(ParamSpec {
                        name: format!("conv{}.bias", i + 1),
                        shape: vec![out],
                        init: Init::Zeros,
                    });
                    channels = out;
                }
                linear(&mut p, "fc1", self.cnn_flat(), CNN_HIDDEN);
                linear(&mut p, "fc2", CNN_HIDDEN, self.classes);
            }
        }
        p
    }

    /// Logits `[B, classes]` of a batch `x: f32[B, C, H, W]`.
    pub fn forward(&self, p: &HashMap<String, Tensor>, x: &Tensor) -> Tensor {
        let batch = x.shape()[0] as i64;
        let linear = |h: &Tensor, name: &str| {
            h.matmul(&p[&format!("{name}.weight")]) + &p[&format!("{name}.bias")]
        };
        // Pixels in [0, 1] centred to [-1, 1]: He initialisation assumes inputs around zero.
        let x = &(x * 2.0 - 1.0);
        match self.arch {
            Arch::Mlp => {
                let flat = x.reshape(&[batch, -1]);
                linear(&linear(&flat, "fc1").relu(), "fc2")
            }
            Arch::Cnn => {
                let mut h = x.clone();
                for i in 1..=2 {
                    let w = &p[&format!("conv{i}.weight")];
                    let b = &p[&format!("conv{i}.bias")];
                    h = h
                        .conv2d(w, Some(b), [1, 1], [1, 1, 1, 1], [1, 1], 1)
                        .relu()
                        .max_pool2d([2, 2], [2, 2], [0, 0, 0, 0]);
                }
                let flat = h.reshape(&[batch, -1]);
                linear(&linear(&flat, "fc1").relu(), "fc2")
            }
        }
    }

    /// The model's name in reports and checkpoints, e.g. `mlp-1x8x8-10`.
    pub fn label(&self) -> String {
        let input: Vec<String> = self.input.iter().map(u64::to_string).collect();
        format!("{}-{}-{}", self.arch.name(), input.join("x"), self.classes)
    }
}

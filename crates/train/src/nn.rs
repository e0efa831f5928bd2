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

/// One layer of a model, in the order data flows. Parameters are named `<name>.weight` and
/// `<name>.bias`; shapes follow from the sample's shape as it flows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layer {
    /// `x @ W + b`, `W` `[inputs, outputs]` (He-normal), `b` zeros; needs a flat `[B, F]` input.
    Linear {
        name: String,
        outputs: u64,
    },
    /// A square convolution with stride 1 and bias, `W` `[channels, C, k, k]` (He-normal).
    Conv2d {
        name: String,
        channels: u64,
        kernel: u32,
        padding: u32,
    },
    Relu,
    /// Max pooling over `size × size` windows with stride `size`.
    MaxPool2d {
        size: u32,
    },
    /// `[B, C, H, W]` to `[B, C·H·W]`.
    Flatten,
}

/// A model: layers fitted to a dataset's sample shape and class count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// `mlp`, `cnn`, or a caller's name for its own layers.
    pub name: String,
    pub layers: Vec<Layer>,
    /// `[C, H, W]` of one sample.
    pub input: Vec<u64>,
    pub classes: u64,
}

const MLP_HIDDEN: u64 = 512;
const CNN_CHANNELS: [u64; 2] = [16, 32];
const CNN_HIDDEN: u64 = 128;

fn linear(name: &str, outputs: u64) -> Layer {
    Layer::Linear {
        name: name.into(),
        outputs,
    }
}

/// What a shape walk through the layers found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("layer {index} ({layer}): {message}")]
pub struct LayerError {
    pub index: usize,
    pub layer: String,
    pub message: String,
}

impl Model {
    /// A bundled architecture for samples of shape `input` and `classes` classes.
    pub fn new(arch: Arch, input: &[u64], classes: u64) -> Model {
        let layers = match arch {
            Arch::Mlp => vec![
                Layer::Flatten,
                linear("fc1", MLP_HIDDEN),
                Layer::Relu,
                linear("fc2", classes),
            ],
            Arch::Cnn => {
                let mut l = Vec::new();
                for (i, &channels) in CNN_CHANNELS.iter().enumerate() {
                    l.push(Layer::Conv2d {
                        name: format!("conv{}", i + 1),
                        channels,
                        kernel: 3,
                        padding: 1,
                    });
                    l.push(Layer::Relu);
                    l.push(Layer::MaxPool2d { size: 2 });
                }
                l.extend([
                    Layer::Flatten,
                    linear("fc1", CNN_HIDDEN),
                    Layer::Relu,
                    linear("fc2", classes),
                ]);
                l
            }
        };
        Model {
            name: arch.name().into(),
            layers,
            input: input.to_vec(),
            classes,
        }
    }

    /// A model of the caller's own layers: the shapes must flow (a linear layer after a
    /// flatten, a convolution or pooling on `[B, C, H, W]`, no window larger than its input,
    /// names unique) and end in `[B, classes]`.
    pub fn from_layers(
        name: &str,
        layers: Vec<Layer>,
        input: &[u64],
        classes: u64,
    ) -> Result<Model, LayerError> {
        let m = Model {
            name: name.into(),
            layers,
            input: input.to_vec(),
            classes,
        };
        m.walk()?;
        Ok(m)
    }

    /// Each layer's parameters and the shape after it, checked as it goes.
    fn walk(&self) -> Result<Vec<ParamSpec>, LayerError> {
        let mut shape = self.input.clone();
        let mut params = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (index, layer) in self.layers.iter().enumerate() {
            let fail = |message: String| LayerError {
                index,
                layer: format!("{layer:?}"),
                message,
            };
            match layer {
                Layer::Linear { name, outputs } => {
                    let [inputs] = shape[..] else {
                        return Err(fail(format!(
                            "needs flat samples, has {shape:?}: flatten first"
                        )));
                    };
                    if *outputs == 0 || !names.insert(name.clone()) {
                        return Err(fail("needs outputs and a name of its own".into()));
                    }
                    params.push(ParamSpec {
                        name: format!("{name}.weight"),
                        shape: vec![inputs, *outputs],
                        init: Init::HeNormal { fan_in: inputs },
                    });
                    params.push(ParamSpec {
                        name: format!("{name}.bias"),
                        shape: vec![*outputs],
                        init: Init::Zeros,
                    });
                    shape = vec![*outputs];
                }
                Layer::Conv2d {
                    name,
                    channels,
                    kernel,
                    padding,
                } => {
                    let [c, h, w] = shape[..] else {
                        return Err(fail(format!("needs [C, H, W] samples, has {shape:?}")));
                    };
                    let (k, p) = (u64::from(*kernel), u64::from(*padding));
                    if *channels == 0 || k == 0 || h + 2 * p < k || w + 2 * p < k {
                        return Err(fail(format!("a {k}×{k} window does not fit {shape:?}")));
                    }
                    if !names.insert(name.clone()) {
                        return Err(fail(format!("the name {name:?} is taken")));
                    }
                    params.push(ParamSpec {
                        name: format!("{name}.weight"),
                        shape: vec![*channels, c, k, k],
                        init: Init::HeNormal { fan_in: c * k * k },
                    });
                    params.push(ParamSpec {
                        name: format!("{name}.bias"),
                        shape: vec![*channels],
                        init: Init::Zeros,
                    });
                    shape = vec![*channels, h + 2 * p - k + 1, w + 2 * p - k + 1];
                }
                Layer::Relu => {}
                Layer::MaxPool2d { size } => {
                    let [c, h, w] = shape[..] else {
                        return Err(fail(format!("needs [C, H, W] samples, has {shape:?}")));
                    };
                    let s = u64::from(*size);
                    if s == 0 || h < s || w < s {
                        return Err(fail(format!("a {s}×{s} window does not fit {shape:?}")));
                    }
                    shape = vec![c, h / s, w / s];
                }
                Layer::Flatten => shape = vec![shape.iter().product()],
            }
        }
        if shape != [self.classes] {
            return Err(LayerError {
                index: self.layers.len(),
                layer: "the end".into(),
                message: format!(
                    "the layers end in {shape:?}, not the {} classes: end with a linear layer of {} outputs",
                    self.classes, self.classes
                ),
            });
        }
        Ok(params)
    }

    /// The parameters in a fixed order (their order is part of a checkpoint's meaning only
    /// through their names).
    pub fn params(&self) -> Vec<ParamSpec> {
        self.walk()
            .expect("a model's layers were checked when it was made")
    }

    /// Logits `[B, classes]` of a batch `x: f32[B, C, H, W]`.
    pub fn forward(&self, p: &HashMap<String, Tensor>, x: &Tensor) -> Tensor {
        self.forward_layers(p, x).0
    }

    /// The logits and each layer's input, in layer order (where a pipeline cuts the forward
    /// pass between layers).
    pub fn forward_layers(&self, p: &HashMap<String, Tensor>, x: &Tensor) -> (Tensor, Vec<Tensor>) {
        let batch = x.shape()[0] as i64;
        // Pixels in [0, 1] centred to [-1, 1]: He initialisation assumes inputs around zero.
        let mut h = x * 2.0 - 1.0;
        let mut inputs = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            inputs.push(h.clone());
            h = match layer {
                Layer::Linear { name, .. } => {
                    h.matmul(&p[&format!("{name}.weight")]) + &p[&format!("{name}.bias")]
                }
                Layer::Conv2d { name, padding, .. } => {
                    let w = &p[&format!("{name}.weight")];
                    let b = &p[&format!("{name}.bias")];
                    h.conv2d(w, Some(b), [1, 1], [*padding; 4], [1, 1], 1)
                }
                Layer::Relu => h.relu(),
                Layer::MaxPool2d { size } => h.max_pool2d([*size; 2], [*size; 2], [0; 4]),
                Layer::Flatten => h.reshape(&[batch, -1]),
            };
        }
        (h, inputs)
    }

    /// The position of a layer named by its name (a layer with parameters: `fc1`, `conv2`) or
    /// by its 0-based position in the layer list.
    pub fn layer_position(&self, layer: &str) -> Option<usize> {
        if let Ok(i) = layer.parse::<usize>() {
            return (i < self.layers.len()).then_some(i);
        }
        self.layers.iter().position(|l| match l {
            Layer::Linear { name, .. } | Layer::Conv2d { name, .. } => name == layer,
            _ => false,
        })
    }

    /// The layers one per line with their positions, for messages that ask for one.
    pub fn describe_layers(&self) -> String {
        let names: Vec<String> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                Layer::Linear { name, .. } | Layer::Conv2d { name, .. } => format!("{i} {name}"),
                Layer::Relu => format!("{i} relu"),
                Layer::MaxPool2d { .. } => format!("{i} max_pool2d"),
                Layer::Flatten => format!("{i} flatten"),
            })
            .collect();
        names.join(", ")
    }

    /// The model's name in reports and checkpoints, e.g. `mlp-1x8x8-10`.
    pub fn label(&self) -> String {
        let input: Vec<String> = self.input.iter().map(u64::to_string).collect();
        format!("{}-{}-{}", self.name, input.join("x"), self.classes)
    }
}

/// What to train: a bundled architecture, or the caller's own layers (fitted to the dataset's
/// sample shape and classes when training starts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    Bundled(Arch),
    Layers { name: String, layers: Vec<Layer> },
}

impl ModelSpec {
    pub fn fit(&self, input: &[u64], classes: u64) -> Result<Model, LayerError> {
        match self {
            ModelSpec::Bundled(arch) => {
                // The bundled layers still have to fit the samples (two pools need 4×4).
                let m = Model::new(*arch, input, classes);
                m.walk()?;
                Ok(m)
            }
            ModelSpec::Layers { name, layers } => {
                Model::from_layers(name, layers.clone(), input, classes)
            }
        }
    }
}

impl From<Arch> for ModelSpec {
    fn from(arch: Arch) -> ModelSpec {
        ModelSpec::Bundled(arch)
    }
}

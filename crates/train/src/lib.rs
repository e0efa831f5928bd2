//! `tenet-train`: training on tenet graphs.
//!
//! A training step is one graph — (parameters, optimizer state, batch) → (parameters', state',
//! loss) — built from a model's forward pass, its loss, the gradient that `tenet-autodiff`
//! appends, and the optimizer's update written with the op set's own ops (`step.rs`), so the
//! reference interpreter defines every bit of training and any node can check any step. The
//! loop (`trainer.rs`) runs that graph on a device, keeps the parameters there between steps,
//! evaluates, checkpoints (`checkpoint.rs`: safetensors named by their hash) and draws the loss
//! curve (`curve.rs`). `data.rs` reads the datasets `tenet models fetch` prepares; `nn.rs`
//! holds the layers and the bundled models; `loss.rs` and `optim.rs` the losses and optimizers.

pub mod checkpoint;
pub mod config;
pub mod curve;
pub mod data;
pub mod loss;
pub mod nn;
pub mod optim;
pub mod step;
pub mod trainer;
pub mod verify;

pub use checkpoint::{Checkpoint, CheckpointError, Meta};
pub use data::{DataError, Dataset};
pub use nn::{Arch, Layer, LayerError, Model, ModelSpec};
pub use optim::Optimizer;
pub use step::{StepError, StepSpec};
pub use trainer::{Event, TrainConfig, TrainError, TrainReport, train};

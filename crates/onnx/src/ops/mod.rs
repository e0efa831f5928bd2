//! The table from ONNX op types to their converters, and helpers the converters share. Each
//! converter reads its node's attributes and inputs (all of them, or the node is refused) and
//! builds tenet ops; docs/ONNX.md lists what each supports.

mod elementwise;
mod loss;
mod nn;
mod reduce;
mod rnn;
mod shape;

use tenet_ir::{DType, Tensor};

use crate::convert::{Cx, NodeIn, Value};

pub(crate) type Converter = fn(&mut Cx, &NodeIn) -> Result<Vec<Value>, String>;

const TABLE: &[(&str, Converter)] = &[
    // elementwise.rs
    ("Abs", elementwise::unary),
    ("Neg", elementwise::unary),
    ("Exp", elementwise::unary),
    ("Log", elementwise::unary),
    ("Sqrt", elementwise::unary),
    ("Reciprocal", elementwise::unary),
    ("Sin", elementwise::unary),
    ("Cos", elementwise::unary),
    ("Tan", elementwise::unary),
    ("Tanh", elementwise::unary),
    ("Sigmoid", elementwise::unary),
    ("Relu", elementwise::unary),
    ("Erf", elementwise::unary),
    ("Floor", elementwise::unary),
    ("Ceil", elementwise::unary),
    ("Round", elementwise::unary),
    ("Sign", elementwise::unary),
    ("Not", elementwise::unary),
    ("Softplus", elementwise::unary),
    ("Softsign", elementwise::unary),
    ("Mish", elementwise::unary),
    ("IsNaN", elementwise::unary),
    ("Sinh", elementwise::unary),
    ("Cosh", elementwise::unary),
    ("Asinh", elementwise::unary),
    ("Acosh", elementwise::unary),
    ("Atanh", elementwise::unary),
    ("Identity", elementwise::identity),
    ("Dropout", elementwise::dropout),
    ("Add", elementwise::binary),
    ("Sub", elementwise::binary),
    ("Mul", elementwise::binary),
    ("Div", elementwise::binary),
    ("Pow", elementwise::binary),
    ("Equal", elementwise::binary),
    ("Less", elementwise::binary),
    ("LessOrEqual", elementwise::binary),
    ("Greater", elementwise::binary),
    ("GreaterOrEqual", elementwise::binary),
    ("And", elementwise::binary),
    ("Or", elementwise::binary),
    ("Xor", elementwise::binary),
    ("Max", elementwise::variadic),
    ("Min", elementwise::variadic),
    ("Sum", elementwise::variadic),
    ("Mean", elementwise::variadic),
    ("Where", elementwise::where_),
    ("Mod", elementwise::modulo),
    ("Cast", elementwise::cast),
    ("CastLike", elementwise::cast_like),
    ("Clip", elementwise::clip),
    ("LeakyRelu", elementwise::activation),
    ("Elu", elementwise::activation),
    ("Selu", elementwise::activation),
    ("Celu", elementwise::activation),
    ("HardSigmoid", elementwise::activation),
    ("HardSwish", elementwise::activation),
    ("ThresholdedRelu", elementwise::activation),
    ("Gelu", elementwise::activation),
    ("Swish", elementwise::activation),
    ("Shrink", elementwise::activation),
    ("PRelu", elementwise::prelu),
    ("IsInf", elementwise::is_inf),
    // nn.rs
    ("MatMul", nn::matmul),
    ("Gemm", nn::gemm),
    ("Conv", nn::conv),
    ("ConvTranspose", nn::conv_transpose),
    ("MaxPool", nn::pool),
    ("AveragePool", nn::pool),
    ("GlobalAveragePool", nn::global_pool),
    ("GlobalMaxPool", nn::global_pool),
    ("BatchNormalization", nn::batch_norm),
    ("InstanceNormalization", nn::instance_norm),
    ("LayerNormalization", nn::layer_norm),
    ("RMSNormalization", nn::layer_norm),
    ("LpNormalization", nn::lp_norm),
    ("LRN", nn::lrn),
    ("Hardmax", nn::hardmax),
    ("Attention", nn::attention),
    ("Softmax", nn::softmax),
    ("LogSoftmax", nn::softmax),
    // reduce.rs
    ("ReduceSum", reduce::reduce),
    ("ReduceMean", reduce::reduce),
    ("ReduceMax", reduce::reduce),
    ("ReduceMin", reduce::reduce),
    ("ReduceSumSquare", reduce::reduce),
    ("ReduceL1", reduce::reduce),
    ("ReduceL2", reduce::reduce),
    ("ReduceLogSum", reduce::reduce),
    ("ReduceLogSumExp", reduce::reduce),
    ("ArgMax", reduce::arg),
    ("ArgMin", reduce::arg),
    // rnn.rs
    ("LSTM", rnn::lstm),
    ("GRU", rnn::gru),
    ("RNN", rnn::rnn),
    // loss.rs
    ("NegativeLogLikelihoodLoss", loss::nll_loss),
    ("SoftmaxCrossEntropyLoss", loss::softmax_cross_entropy),
    // shape.rs
    ("Constant", shape::constant),
    ("Shape", shape::shape),
    ("Size", shape::size),
    ("ConstantOfShape", shape::constant_of_shape),
    ("Range", shape::range),
    ("Reshape", shape::reshape),
    ("Flatten", shape::flatten),
    ("Squeeze", shape::squeeze),
    ("Unsqueeze", shape::unsqueeze),
    ("Transpose", shape::transpose),
    ("Concat", shape::concat),
    ("Split", shape::split),
    ("Slice", shape::slice),
    ("Gather", shape::gather),
    ("GatherElements", shape::gather_elements),
    ("EyeLike", shape::eye_like),
    ("OneHot", shape::one_hot),
    ("Expand", shape::expand),
    ("Tile", shape::tile),
    ("Pad", shape::pad),
    ("DepthToSpace", shape::depth_to_space),
    ("SpaceToDepth", shape::space_to_depth),
    ("Trilu", shape::trilu),
    ("Resize", shape::resize),
    ("Upsample", shape::resize),
];

/// The converter of an ONNX op type.
pub(crate) fn converter(op_type: &str) -> Option<Converter> {
    TABLE
        .iter()
        .find(|(name, _)| *name == op_type)
        .map(|(_, f)| *f)
}

/// Every ONNX op type the importer maps, in the order of docs/ONNX.md's table.
pub fn supported_ops() -> Vec<&'static str> {
    TABLE.iter().map(|(name, _)| *name).collect()
}

/// One symbolic result.
pub(crate) fn one(t: Tensor) -> Result<Vec<Value>, String> {
    Ok(vec![Value::Sym(t)])
}

/// An axis in `-rank..rank` as an index.
pub(crate) fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let n = if a < 0 { a + r } else { a };
    if (0..r).contains(&n) {
        Ok(n as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// A scalar of `dtype` in `cx`'s builder.
pub(crate) fn scalar(cx: &Cx, dtype: DType, v: f64) -> Tensor {
    cx.g.scalar(dtype, v)
}

/// Element count of a shape (already bounded by the graph's limits).
pub(crate) fn product(dims: &[u64]) -> u64 {
    dims.iter().product()
}

/// Dimensions as the builder's signed reshape targets.
pub(crate) fn signed(dims: &[u64]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// The i64 constant `values` shaped `shape`.
pub(crate) fn index_tensor(cx: &Cx, shape: &[u64], values: &[i64]) -> Tensor {
    cx.g.constant_i64(shape, values)
}

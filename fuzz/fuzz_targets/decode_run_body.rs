//! Fuzz the body of a call to a deployed task, as the coordinator decodes it against the
//! task's declared inputs. Nothing may panic, and an accepted body holds every declared input
//! with exactly its declared type (so never more elements than the task declares).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_ir::{DType, TensorType};
use tenet_proto::run_body::decode_run_json;

fuzz_target!(|data: &[u8]| {
    let x = TensorType::new(DType::F32, vec![2, 3]);
    let ids = TensorType::new(DType::I64, vec![4]);
    let mask = TensorType::new(DType::Bool, vec![]);
    let half = TensorType::new(DType::F16, vec![0, 2]);
    let inputs = [("x", &x), ("ids", &ids), ("mask", &mask), ("h", &half)];
    if let Ok(body) = decode_run_json(data, &inputs) {
        assert_eq!(body.inputs.len(), inputs.len());
        for (name, ty) in inputs {
            assert_eq!(body.inputs[name].ty(), ty, "input {name}");
        }
    }
});

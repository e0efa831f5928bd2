#!/usr/bin/env python3
"""Writes the ONNX backend's node tests as model.onnx + test_data_set_N/{input,output}_K.pb.

The `onnx` wheel (1.23.2, pinned in .ci/run) ships the node tests as Python cases rather than
files; this turns them into the same layout as its pytorch-converted and pytorch-operator
data, which crates/onnx/tests/backend.rs runs. Inputs are drawn from numpy's generator seeded
with 0, so the files are the same on every run. Usage: onnx-node-tests.py OUT_DIR
"""

import os
import sys
import warnings

import numpy as np

np.random.seed(0)
warnings.filterwarnings("ignore")

import onnx.backend.test.case.node as node_test  # noqa: E402
from onnx import TensorProto, numpy_helper  # noqa: E402


def write(path, value, name):
    if isinstance(value, TensorProto):
        data = value.SerializeToString()
    elif isinstance(value, np.ndarray) or np.isscalar(value):
        data = numpy_helper.from_array(np.asarray(value), name).SerializeToString()
    else:
        return False  # sequences, maps, optionals: tenet has no such values
    with open(path, "wb") as f:
        f.write(data)
    return True


def main():
    out = sys.argv[1]
    cases = node_test.collect_testcases(None)
    written = 0
    for case in cases:
        if case.kind != "node" or case.model is None:
            continue
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets or []):
            sd = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(sd, exist_ok=True)
            for j, v in enumerate(inputs):
                write(os.path.join(sd, f"input_{j}.pb"), v, case.model.graph.input[j].name)
            for j, v in enumerate(outputs):
                write(os.path.join(sd, f"output_{j}.pb"), v, case.model.graph.output[j].name)
        written += 1
    print(f"{written} node tests written to {out}")


if __name__ == "__main__":
    main()

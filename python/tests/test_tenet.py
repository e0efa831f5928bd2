"""The tenet Python package as a user drives it: building, running, loading, importing ONNX,
numpy round trips of every dtype, and errors that say what was wrong and where."""

import pathlib

import numpy as np
import pytest

import tenet

REPO = pathlib.Path(__file__).resolve().parents[2]


def line_of(marker):
    """The line of this file holding `marker` (for error-location checks)."""
    for i, text in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1):
        if marker in text and "line_of(" not in text:
            return i
    raise AssertionError(marker)


def test_a_built_mlp_matches_numpy():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    b1 = rng.standard_normal(32).astype(np.float32)
    w2 = rng.standard_normal((32, 10)).astype(np.float32)
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [8, 64])
    h = (x @ g.constant(w1) + g.constant(b1)).relu()
    y = (h @ g.constant(w2)).softmax(-1)
    graph = g.finish({"y": y, "h": h})
    assert [n for n, _, _ in graph.outputs] == ["y", "h"]
    xv = rng.standard_normal((8, 64)).astype(np.float32)
    out = graph.run({"x": xv})
    hv = np.maximum(xv @ w1 + b1, 0)
    logits = hv @ w2
    want = np.exp(logits - logits.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(out["h"], hv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)
    # The same bits at any thread count; results are writable arrays.
    again = graph.run({"x": xv}, threads=1)
    assert again["y"].tobytes() == out["y"].tobytes()
    again["y"][0, 0] = 5.0


def test_builder_mistakes_name_the_file_and_line():
    g = tenet.GraphBuilder()
    a = g.input("a", "f32", [2, 3])
    b = g.input("b", "f32", [4, 5])
    with pytest.raises(tenet.TenetError) as e:
        a @ b  # the mistake: inner dimensions differ
    msg = str(e.value)
    assert f"test_tenet.py:{line_of('the mistake: inner')}" in msg, msg
    assert "matmul" in msg
    with pytest.raises(tenet.TenetError) as e:
        a.reshape(7, -1)  # cannot infer
    assert f"test_tenet.py:{line_of('cannot infer')}" in str(e.value)
    with pytest.raises(tenet.TenetError):
        g.input("a", "f32", [1])  # declared twice
    with pytest.raises(tenet.TenetError) as e:
        g.input("c", "f64", [1])
    assert "unknown dtype" in str(e.value)


def test_numpy_round_trips_of_every_dtype():
    values = {
        "f32": np.array([[1.5, -0.0, np.inf], [np.nan, 3e-42, -2.0]], np.float32),
        "f16": np.array([[1.5, -0.0], [65504.0, 6e-8]], np.float16),
        "i32": np.array([[-(2**31), 7, 2**31 - 1]], np.int32),
        "i64": np.array([-(2**63), 0, 2**63 - 1], np.int64),
        "u8": np.arange(256, dtype=np.uint8).reshape(16, 16),
        "bool": np.array([True, False, True]),
    }
    for dt, v in values.items():
        g = tenet.GraphBuilder()
        x = g.input("x", dt, list(v.shape))
        graph = g.finish({"y": x.reshape(-1)})
        y = graph.run({"x": v})["y"]
        assert y.dtype == v.dtype, dt
        assert y.tobytes() == v.reshape(-1).tobytes(), dt
    # bfloat16 has no numpy dtype: a bf16 result comes back as float32, exactly.
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [3])
    graph = g.finish({"y": x.cast("bf16")})
    y = graph.run({"x": np.array([1.0, 3.0, -0.5], np.float32)})["y"]
    assert y.dtype == np.float32 and list(y) == [1.0, 3.0, -0.5]


def test_what_a_caller_passes_is_checked_never_crashes():
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    graph = g.finish({"y": x * 3.0})
    with pytest.raises(tenet.TenetError, match="float64.*astype"):
        graph.run({"x": np.zeros((2, 3))})
    with pytest.raises(tenet.TenetError, match="int64 but the graph declares it f32"):
        graph.run({"x": np.zeros((2, 3), np.int64)})
    with pytest.raises(tenet.TenetError, match=r'input "x" is f32\[3,2\], the graph expects f32\[2,3\]'):
        graph.run({"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(tenet.TenetError, match='missing input "x"'):
        graph.run({})
    with pytest.raises(tenet.TenetError, match='unexpected input "extra"'):
        graph.run({"x": np.zeros((2, 3), np.float32), "extra": np.zeros(1, np.float32)})
    with pytest.raises(tenet.TenetError, match="complex"):
        graph.run({"x": np.zeros((2, 3), np.complex64)})
    # A non-contiguous view is read in its logical order.
    base = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = graph.run({"x": base.T})["y"]
    np.testing.assert_array_equal(y, base.T * 3)
    with pytest.raises(tenet.TenetError, match='unknown device "quantum"'):
        graph.run({"x": np.zeros((2, 3), np.float32)}, device="quantum")


def test_load_a_graph_with_its_weights():
    graph = tenet.load(REPO / "examples" / "mlp.tg", weights=REPO / "examples" / "mlp.safetensors")
    (name, dt, shape), = graph.inputs
    assert dt == "f32"
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    a = graph.run({name: x})
    b = graph.run({name: x}, threads=1)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert len(graph.weights_ids) == 1
    with pytest.raises(tenet.TenetError, match="weights"):
        tenet.load(REPO / "examples" / "mlp.tg").run({name: x})
    with pytest.raises(tenet.TenetError, match="cannot read"):
        tenet.load(REPO / "examples" / "missing.tg")


def test_save_and_load_keep_the_id(tmp_path):
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [4])
    graph = g.finish({"y": (x + 1.0).exp()})
    graph.save(tmp_path / "g.tnt")
    again = tenet.load(tmp_path / "g.tnt")
    assert again.id == graph.id
    assert "exp" in again.text()
    assert again.cost["flops"] > 0


def test_import_an_onnx_model_and_run_it(tmp_path):
    model = REPO / "fuzz" / "corpus" / "import_onnx" / "seed-test_relu.onnx"
    graph = tenet.import_onnx(model)
    assert graph.inputs == [("x", "f32", [3, 4, 5])]
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(graph.run({"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(tenet.TenetError, match="fixed to 5"):
        tenet.import_onnx(model, shapes={"x": [3, 4, 6]})
    conv = REPO / "fuzz" / "corpus" / "import_onnx" / "seed-test_conv_with_strides_padding.onnx"
    g2 = tenet.import_onnx(conv)
    names = [n for n, _, _ in g2.inputs]
    assert len(names) == 2
    with pytest.raises(tenet.TenetError, match="not an ONNX model"):
        bad = tmp_path / "bad.onnx"
        bad.write_bytes(b"\xff" * 64)
        tenet.import_onnx(bad)

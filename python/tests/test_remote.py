"""The eager mode against a node started on loopback by tenet.remote("local"): 1000 small ops
then one read cost one batch (plus storing the recorded graph), and the values equal the lazy
builder's bit for bit; tensors stay resident between reads; mistakes are TenetErrors."""

import os
import pathlib

import numpy as np
import pytest

import tenet

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("TENET_BIN", str(REPO / "target" / "debug" / "tenet"))

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason=f"no tenet binary at {BIN}")


@pytest.fixture(autouse=True)
def _binary(monkeypatch):
    monkeypatch.setenv("TENET_BIN", BIN)


def chain(start, steps):
    """The same 1000 small ops, on eager and on lazy tensors alike."""
    v = start
    for i in range(steps):
        v = (v * 1.001 + 0.5).tanh() if i % 2 else (v - 0.25).relu() + v * 0.5
    return v


def test_a_thousand_ops_then_one_read_is_one_batch():
    x = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    g = tenet.GraphBuilder()
    lazy = chain(g.input("x", "f32", [16, 16]), 1000)
    want = g.finish({"y": lazy}).run({"x": x})["y"]
    with tenet.remote("local") as r:
        a = r.tensor(x)
        y = chain(a, 1000)
        before, batches = r.requests, r.batches
        got = y.numpy()
        assert r.batches == batches + 1
        assert r.requests - before == 2, "the recorded graph stored, then one batch"
        assert got.tobytes() == want.tobytes()
        # Resident now: reading it again, or building on it, runs nothing twice.
        before = r.requests
        assert y.numpy().tobytes() == want.tobytes()
        assert r.requests - before == 1
        z = (y @ a).sum()
        np.testing.assert_allclose(z.numpy(), (want @ x).sum(), rtol=1e-4)


def test_mistakes_are_errors_and_the_session_goes_on():
    with tenet.remote("local") as r:
        a = r.tensor(np.ones((2, 3), np.float32))
        with pytest.raises(tenet.TenetError, match="matmul"):
            a @ a
        b = r.tensor(np.full((3, 2), 2.0, np.float32))
        np.testing.assert_array_equal((a @ b).numpy(), np.full((2, 2), 6.0, np.float32))
        with pytest.raises(tenet.TenetError, match="float64"):
            r.tensor(np.zeros(3))


def test_a_node_that_is_not_there():
    with pytest.raises(tenet.TenetError):
        tenet.remote("http://127.0.0.1:9")

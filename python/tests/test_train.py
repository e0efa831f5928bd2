"""Gradients and training from Python: `GraphBuilder.gradients` and `tenet.grad` against
closed forms computed with numpy, and `tenet.train` on the digits (skipped when the dataset is
not in the cache: `tenet models fetch digits`; .ci/run fetches it)."""

import os
import pathlib

import numpy as np
import pytest

import tenet

CACHE = pathlib.Path(os.environ.get("TENET_MODELS", pathlib.Path.home() / ".cache" / "tenet" / "models"))


def fetched(name):
    return any((d / ".complete").is_file() for d in CACHE.glob(f"{name}-*"))


def test_gradients_of_a_layer_match_the_closed_form():
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    wv = rng.standard_normal((4, 3)).astype(np.float32)
    rv = rng.standard_normal((5, 3)).astype(np.float32)
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [5, 4])
    w = g.input("w", "f32", [4, 3])
    r = g.input("r", "f32", [5, 3])
    loss = ((x @ w).tanh() * r).sum([0, 1])
    dw, dx = g.gradients(loss, [w, x])
    assert dw.shape == [4, 3] and dx.shape == [5, 4]
    out = g.finish({"loss": loss, "dw": dw, "dx": dx}).run({"x": xv, "w": wv, "r": rv})
    t = np.tanh(xv @ wv)
    upstream = rv * (1 - t * t)
    np.testing.assert_allclose(out["dw"], xv.T @ upstream, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["dx"], upstream @ wv.T, rtol=1e-5, atol=1e-5)
    # The same through a finished graph.
    g2 = tenet.GraphBuilder()
    x2 = g2.input("x", "f32", [5, 4])
    w2 = g2.input("w", "f32", [4, 3])
    r2 = g2.input("r", "f32", [5, 3])
    forward = g2.finish({"loss": ((x2 @ w2).tanh() * r2).sum([0, 1])})
    back = tenet.grad(forward, "loss", ["w"])
    assert [n for n, _, _ in back.outputs] == ["loss", "grad/w"]
    got = back.run({"x": xv, "w": wv, "r": rv})
    assert got["grad/w"].tobytes() == out["dw"].tobytes()
    with pytest.raises(tenet.TenetError, match="scalar f32"):
        g.gradients(x @ w, [w])
    with pytest.raises(tenet.TenetError, match="no input named"):
        tenet.grad(forward, "loss", ["nope"])


@pytest.mark.skipif(not fetched("digits"), reason="the digits are not in the model cache")
def test_training_is_deterministic_and_learns(tmp_path):
    a = tenet.train("digits", seed=4, epochs=3, out=tmp_path / "a", threads=2)
    b = tenet.train("digits", seed=4, epochs=3, out=tmp_path / "b", threads=1)
    assert a["weights_hash"] == b["weights_hash"]
    assert a["steps"] == 3 * (1438 // 32)
    assert a["test_accuracy"] > 0.85, a
    assert pathlib.Path(a["loss_svg"]).is_file()
    other = tenet.train("digits", seed=5, epochs=1, out=tmp_path / "c")
    assert other["weights_hash"] != a["weights_hash"]
    with pytest.raises(tenet.TenetError, match="choose mlp or cnn"):
        tenet.train("digits", model="resnet")
    # The caller's own layers.
    from tenet import nn
    mine = [nn.Conv2d("c", 8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear("out", 10)]
    r = tenet.train("digits", model=mine, seed=4, epochs=4, lr=3e-3, out=tmp_path / "d")
    assert r["model"].startswith("custom-") and r["test_accuracy"] > 0.8, r
    with pytest.raises(tenet.TenetError, match="flatten first"):
        tenet.train("digits", model=[nn.Linear("out", 10)], epochs=1, out=tmp_path / "e")
    with pytest.raises(tenet.TenetError, match="unknown dataset"):
        tenet.train("cifar")

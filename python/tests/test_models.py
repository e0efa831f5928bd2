"""The bundled models from Python, against the shared reference fixtures (the numpy reference
programs' outputs): MiniLM embeddings and SmolLM2's greedy tokens. Skipped when the models are
not in the cache (`tenet models fetch minilm smollm2`; .ci/run fetches them)."""

import json
import os
import pathlib

import numpy as np
import pytest

import tenet

# Copies of shared/models/fixtures, kept in the repository.
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"
CACHE = pathlib.Path(os.environ.get("TENET_MODELS", pathlib.Path.home() / ".cache" / "tenet" / "models"))


def fetched(name):
    return any((d / ".complete").is_file() for d in CACHE.glob(f"{name}-*"))


@pytest.mark.skipif(not fetched("minilm"), reason="MiniLM is not in the model cache")
def test_embeddings_match_the_reference():
    want = json.loads((FIXTURES / "minilm_embeddings.json").read_text())
    sentences = list(want)
    got = tenet.embed(sentences)
    assert got.shape == (len(sentences), 384) and got.dtype == np.float32
    for row, s in zip(got, sentences):
        np.testing.assert_allclose(row, want[s]["embedding"], atol=1e-5)
    one = tenet.embed(sentences[0], threads=1)
    assert one.shape == (1, 384)
    with pytest.raises(tenet.TenetError):
        tenet.embed([])


@pytest.mark.skipif(not fetched("smollm2"), reason="SmolLM2 is not in the model cache")
def test_greedy_generation_matches_the_reference():
    want = json.loads((FIXTURES / "smollm2_greedy.json").read_text())
    prompt, ref = next(iter(want.items()))
    text, tokens = tenet.generate(prompt, max_tokens=12, return_tokens=True)
    assert tokens == ref["greedy12"]
    assert text.startswith(" Paris"), text
    a = tenet.generate("Once upon a time", max_tokens=8, temperature=0.8, seed=7)
    b = tenet.generate("Once upon a time", max_tokens=8, temperature=0.8, seed=7, threads=1)
    assert a == b
    with pytest.raises(tenet.TenetError, match="temperature"):
        tenet.generate("x", temperature=-1.0)

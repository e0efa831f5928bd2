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


@pytest.mark.skipif(not fetched("smollm2"), reason="SmolLM2 is not in the model cache")
def test_q8_arithmetic_gives_its_own_tokens_the_same_at_any_thread_count():
    prompt = "The capital of France is"
    _, exact = tenet.generate(prompt, max_tokens=7, return_tokens=True)
    _, q8 = tenet.generate(prompt, max_tokens=7, return_tokens=True, arithmetic="q8")
    _, q8_one = tenet.generate(prompt, max_tokens=7, return_tokens=True, arithmetic="q8", threads=1)
    # The two arithmetics agree on the first five tokens of this prompt and part at the sixth.
    assert q8[:5] == exact[:5] and q8[5] != exact[5], (q8, exact)
    assert q8 == q8_one
    with pytest.raises(tenet.TenetError, match="exact.*q8"):
        tenet.generate(prompt, arithmetic="q4")

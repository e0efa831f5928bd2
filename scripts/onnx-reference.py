#!/usr/bin/env python3
"""onnxruntime's outputs for an ONNX model on deterministic, real-looking inputs.

Usage: onnx-reference.py MODEL.onnx OUT_DIR N,C,H,W [SEED]
       onnx-reference.py MODEL.onnx OUT_DIR --inputs JSON [SEED]

The first form feeds the model's first input an image-like tensor in RapidOCR's normalisation
((v/255 - 0.5)/0.5): a paper-coloured background with a soft gradient, dark strokes and blocks
like lines of text, and a little noise. The second names every input:
{"name": ["image", [n, c, h, w]] | ["audio", [batch, samples]] | ["zeros", shape] |
["int", value]} — audio is a chirp with a spoken-like envelope and noise, in [-1, 1]. All from
numpy's generator seeded with SEED (default 0). Writes OUT_DIR/input.npy (the image form) or
OUT_DIR/input_NAME.npy, and OUT_DIR/output_K.npy for each output, in the model's output order,
computed by onnxruntime on one thread (pinned in .ci/run: onnxruntime==1.31.1).
"""

import json
import os
import sys

import numpy as np
import onnxruntime as ort


def image(shape, seed):
    n, c, h, w = shape
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 225.0 + 20.0 * (x / max(w - 1, 1)) - 15.0 * (y / max(h - 1, 1))
    img = np.repeat(base[None, None], c, axis=1).repeat(n, axis=0)
    # Lines of "text": runs of dark glyph-sized blocks with gaps.
    line_h = max(4, h // 12)
    for top in range(line_h, h - line_h, 2 * line_h):
        left = int(rng.integers(0, max(1, w // 8)))
        while left < w - line_h:
            gw = int(rng.integers(max(2, line_h // 3), max(3, line_h)))
            ink = float(rng.uniform(10, 80))
            img[:, :, top : top + line_h, left : left + gw] = ink
            left += gw + int(rng.integers(1, max(2, line_h // 2)))
            if rng.random() < 0.15:
                left += 2 * line_h
    img += rng.normal(0.0, 4.0, img.shape)
    img = np.clip(img, 0, 255)
    return ((img / 255.0 - 0.5) / 0.5).astype(np.float32)


def audio(shape, seed):
    rng = np.random.default_rng(seed)
    batch, n = shape
    t = np.arange(n, dtype=np.float64) / 16000.0
    chirp = np.sin(2 * np.pi * (150 + 900 * t) * t)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t)
    x = 0.6 * chirp * envelope + rng.normal(0.0, 0.05, (batch, n))
    return np.clip(x, -1, 1).astype(np.float32)


def named_inputs(spec, seed):
    feeds = {}
    for i, (name, (kind, arg)) in enumerate(spec.items()):
        if kind == "image":
            feeds[name] = image(arg, seed + i)
        elif kind == "audio":
            feeds[name] = audio(arg, seed + i)
        elif kind == "zeros":
            feeds[name] = np.zeros(arg, np.float32)
        elif kind == "int":
            feeds[name] = np.array(arg, np.int64)
        else:
            raise SystemExit(f"unknown input kind {kind!r}")
    return feeds


def main():
    model, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    if sys.argv[3] == "--inputs":
        seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        feeds = named_inputs(json.loads(sys.argv[4]), seed)
        for name, v in feeds.items():
            np.save(os.path.join(out, f"input_{name}.npy"), v)
    else:
        shape = [int(d) for d in sys.argv[3].split(",")]
        seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        x = image(shape, seed)
        feeds = {sess.get_inputs()[0].name: x}
        np.save(os.path.join(out, "input.npy"), x)
    outs = sess.run(None, feeds)
    for k, o in enumerate(outs):
        np.save(os.path.join(out, f"output_{k}.npy"), o)
    print(f"{model}: inputs {sorted(feeds)}, {len(outs)} outputs")


if __name__ == "__main__":
    main()

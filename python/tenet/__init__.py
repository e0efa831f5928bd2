"""tenet from Python: verifiable tensor compute with numpy arrays.

Load a graph (``tenet.load``), import an ONNX model (``tenet.import_onnx``) or build one
lazily (``tenet.GraphBuilder``), then run it on this machine with numpy arrays
(``graph.run``). Results are bit-identical at every thread count and SIMD level. Every error is
a ``tenet.TenetError`` with tenet's own message; errors of the builder name the file and line
of the call that made the mistake.

    >>> import numpy as np, tenet
    >>> g = tenet.GraphBuilder()
    >>> x = g.input("x", "f32", [2, 3])
    >>> graph = g.finish({"y": (x * 2.0).relu()})
    >>> graph.run({"x": np.array([[1, -2, 3], [-4, 5, -6]], np.float32)})["y"]
    array([[ 2.,  0.,  6.],
           [ 0., 10.,  0.]], dtype=float32)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import TenetError

__all__ = [
    "CallResult",
    "RemoteTensor",
    "Session",
    "Client",
    "Graph",
    "GraphBuilder",
    "Tensor",
    "TenetError",
    "embed",
    "generate",
    "import_onnx",
    "grad",
    "load",
    "nn",
    "remote",
    "train",
    "verify_receipt",
]

#: tenet's dtypes as numpy's. bfloat16 has no numpy dtype: bf16 results come back as float32
#: (exactly), and bf16 inputs are refused.
_NUMPY = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
_TENET = {v: k for k, v in _NUMPY.items()}

PathLike = Union[str, "os.PathLike[str]"]


def _caller() -> str:
    """``file:line`` of the nearest frame outside this package."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def _located(call, *args):
    """Run a builder call; a mistake is raised naming the caller's file and line."""
    try:
        return call(*args)
    except TenetError as e:
        raise TenetError(f"{_caller()}: {e}") from None


def _raw(name: str, value, want: Optional[str] = None) -> Tuple[bytes, str, List[int]]:
    """A numpy value as ``(bytes, dtype, shape)``, checked against the declared dtype."""
    a = np.asarray(value)
    dt = _TENET.get(a.dtype)
    if dt is None:
        hint = ""
        if a.dtype == np.float64:
            hint = f"; tenet has no float64: pass {name}.astype(np.float32)"
        raise TenetError(
            f"{name} has dtype {a.dtype}, which tenet does not have "
            f"(float32, float16, int32, int64, uint8, bool){hint}"
        )
    if want is not None and dt != want:
        raise TenetError(f"{name} is {a.dtype} but the graph declares it {want}")
    a = np.ascontiguousarray(a)
    return (a.tobytes(), dt, [int(d) for d in a.shape])


def _array(raw) -> np.ndarray:
    data, dt, shape = raw
    if dt == "bf16":
        bits = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=_NUMPY[dt]).reshape(shape)


class Graph:
    """A validated tenet graph, with the weights files it refers to by hash."""

    def __init__(self, native: "_native.Graph"):
        self._g = native
        self._attached: set = set()  # weights files already given, by path

    @property
    def id(self) -> str:
        """The graph's id: blake3 of its canonical encoding, hex."""
        return self._g.id

    @property
    def inputs(self) -> List[Tuple[str, str, List[int]]]:
        """``[(name, dtype, shape)]`` of the inputs."""
        return self._g.inputs

    @property
    def outputs(self) -> List[Tuple[str, str, List[int]]]:
        """``[(name, dtype, shape)]`` of the outputs."""
        return self._g.outputs

    @property
    def cost(self) -> Dict[str, int]:
        """The cost certificate (flops, bytes read and written, peak bytes, ...)."""
        return self._g.cost

    @property
    def weights_ids(self) -> List[str]:
        """Hex ids of the weights files the graph refers to."""
        return self._g.weights_ids

    def text(self) -> str:
        """The graph in tenet's text form."""
        return self._g.text()

    def save(self, path: PathLike) -> None:
        """Write the binary graph (``.tnt``)."""
        self._g.save(os.fspath(path))

    def save_weights(self, path: PathLike) -> None:
        """Write the safetensors file an ONNX import produced."""
        self._g.save_weights(os.fspath(path))

    def add_weights(self, path: PathLike) -> None:
        """Attach a safetensors file the graph refers to; later runs use it. A file already
        attached is not read again."""
        key = os.path.realpath(os.fspath(path))
        if key in self._attached:
            return
        self._g.add_weights(os.fspath(path))
        self._attached.add(key)

    def run(
        self,
        inputs: Mapping[str, object],
        weights: Union[None, PathLike, Iterable[PathLike]] = None,
        threads: Optional[int] = None,
        device: str = "cpu",
        seed: int = 0,
    ) -> Dict[str, np.ndarray]:
        """Run on ``{name: array}``; returns ``{name: array}``.

        ``weights`` (a path or paths) are attached before running; ``device`` is ``cpu``,
        ``opencl`` or ``opencl:N``; ``threads`` defaults to one per core. Inputs are converted
        only when they are not already C-contiguous; results are writable arrays over the
        result's own buffer.
        """
        if weights is not None:
            paths = [weights] if isinstance(weights, (str, os.PathLike)) else list(weights)
            for w in paths:
                self.add_weights(w)
        declared = {n: d for n, d, _ in self._g.inputs}
        raw = {}
        for name, value in inputs.items():
            raw[name] = _raw(name, value, declared.get(name))
        out = self._g.run_raw(raw, threads, device, seed)
        return {name: _array(r) for name, r in out.items()}

    def __repr__(self) -> str:
        return repr(self._g)


def load(path: PathLike, weights: Union[None, PathLike, Iterable[PathLike]] = None) -> Graph:
    """Load a graph (binary ``.tnt`` or text ``.tg``) and the safetensors files it uses."""
    paths = [] if weights is None else (
        [weights] if isinstance(weights, (str, os.PathLike)) else list(weights)
    )
    return Graph(_native.load(os.fspath(path), [os.fspath(p) for p in paths]))


def import_onnx(
    path: PathLike,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    fixed: Optional[Mapping[str, object]] = None,
) -> Graph:
    """Import an ONNX model: ``shapes`` fixes inputs' shapes (required for dynamic
    dimensions), ``fixed`` fixes inputs' values (arrays), which become constants. The graph
    carries its imported weights; ``graph.save_weights`` writes them."""
    shapes = {k: [int(d) for d in v] for k, v in (shapes or {}).items()}
    fixed_raw = {k: _raw(k, v) for k, v in (fixed or {}).items()}
    return Graph(_native.import_onnx(os.fspath(path), shapes, fixed_raw))


Scalar = Union[int, float, bool]


class Tensor:
    """A lazy tensor of a ``GraphBuilder``'s graph. Operators broadcast like numpy; a Python
    number becomes a constant of the tensor's dtype."""

    __slots__ = ("_t", "_b")
    __array_priority__ = 1000  # so that ndarray <op> Tensor defers to Tensor

    def __init__(self, native: "_native.Tensor", builder: "GraphBuilder"):
        self._t = native
        self._b = builder

    @property
    def dtype(self) -> str:
        return self._t.dtype

    @property
    def shape(self) -> List[int]:
        return self._t.shape

    def _lift(self, other) -> "Tensor":
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (int, float, bool, np.number)):
            return Tensor(_located(self._b._b.scalar, float(other), self.dtype), self._b)
        return self._b.constant(np.asarray(other, dtype=_NUMPY.get(self.dtype)))

    def _bin(self, op: str, other, swap: bool = False) -> "Tensor":
        o = self._lift(other)
        a, b = (o, self) if swap else (self, o)
        return Tensor(_located(a._t.binary, op, b._t), self._b)

    def _un(self, op: str) -> "Tensor":
        return Tensor(_located(self._t.unary, op), self._b)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __pow__(self, o): return self._bin("pow", o)
    def __matmul__(self, o): return self._bin("matmul", o)
    def __rmatmul__(self, o): return self._bin("matmul", o, True)
    def __neg__(self): return self._un("neg")
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)

    def eq(self, o) -> "Tensor": return self._bin("eq", o)
    def ne(self, o) -> "Tensor": return self._bin("ne", o)
    def maximum(self, o) -> "Tensor": return self._bin("maximum", o)
    def minimum(self, o) -> "Tensor": return self._bin("minimum", o)
    def logical_and(self, o) -> "Tensor": return self._bin("and", o)
    def logical_or(self, o) -> "Tensor": return self._bin("or", o)
    def matmul(self, o) -> "Tensor": return self._bin("matmul", o)

    def abs(self) -> "Tensor": return self._un("abs")
    def exp(self) -> "Tensor": return self._un("exp")
    def log(self) -> "Tensor": return self._un("log")
    def sqrt(self) -> "Tensor": return self._un("sqrt")
    def rsqrt(self) -> "Tensor": return self._un("rsqrt")
    def reciprocal(self) -> "Tensor": return self._un("reciprocal")
    def sin(self) -> "Tensor": return self._un("sin")
    def cos(self) -> "Tensor": return self._un("cos")
    def tanh(self) -> "Tensor": return self._un("tanh")
    def sigmoid(self) -> "Tensor": return self._un("sigmoid")
    def relu(self) -> "Tensor": return self._un("relu")
    def gelu(self) -> "Tensor": return self._un("gelu")
    def gelu_tanh(self) -> "Tensor": return self._un("gelu_tanh")
    def erf(self) -> "Tensor": return self._un("erf")
    def floor(self) -> "Tensor": return self._un("floor")
    def ceil(self) -> "Tensor": return self._un("ceil")
    def round(self) -> "Tensor": return self._un("round")
    def sign(self) -> "Tensor": return self._un("sign")
    def logical_not(self) -> "Tensor": return self._un("not")

    def where(self, a, b) -> "Tensor":
        """``self ? a : b`` elementwise (``self`` is bool)."""
        a, b = self._lift(a), self._lift(b)
        return Tensor(_located(self._t.where_, a._t, b._t), self._b)

    def cast(self, dtype: str) -> "Tensor":
        return Tensor(_located(self._t.cast, dtype), self._b)

    def reshape(self, *shape) -> "Tensor":
        """New shape; one dimension may be -1."""
        dims = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)
        return Tensor(_located(self._t.reshape, [int(d) for d in dims]), self._b)

    def permute(self, *perm) -> "Tensor":
        p = list(perm[0]) if len(perm) == 1 and not isinstance(perm[0], int) else list(perm)
        return Tensor(_located(self._t.permute, [int(d) for d in p]), self._b)

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        return Tensor(_located(self._t.transpose, a, b), self._b)

    @property
    def T(self) -> "Tensor":
        return self.transpose(-2, -1)

    def expand(self, *shape) -> "Tensor":
        dims = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)
        return Tensor(_located(self._t.expand, [int(d) for d in dims]), self._b)

    def slice(self, axis: int, start: int, end: int, step: int = 1) -> "Tensor":
        return Tensor(_located(self._t.slice, axis, start, end, step), self._b)

    def gather(self, indices: "Tensor", axis: int = 0) -> "Tensor":
        return Tensor(_located(self._t.gather, self._lift(indices)._t, axis), self._b)

    def _reduce(self, op: str, axis, keepdim: bool) -> "Tensor":
        if axis is None:
            axes = list(range(len(self.shape)))
        elif isinstance(axis, int):
            axes = [axis]
        else:
            axes = list(axis)
        return Tensor(_located(self._t.reduce, op, axes, keepdim), self._b)

    def sum(self, axis=None, keepdim: bool = False) -> "Tensor": return self._reduce("sum", axis, keepdim)
    def mean(self, axis=None, keepdim: bool = False) -> "Tensor": return self._reduce("mean", axis, keepdim)
    def max(self, axis=None, keepdim: bool = False) -> "Tensor": return self._reduce("max", axis, keepdim)
    def min(self, axis=None, keepdim: bool = False) -> "Tensor": return self._reduce("min", axis, keepdim)
    def argmax(self, axis: int = -1, keepdim: bool = False) -> "Tensor": return self._reduce("argmax", axis, keepdim)
    def argmin(self, axis: int = -1, keepdim: bool = False) -> "Tensor": return self._reduce("argmin", axis, keepdim)

    def softmax(self, axis: int = -1) -> "Tensor":
        return Tensor(_located(self._t.softmax, axis), self._b)

    def log_softmax(self, axis: int = -1) -> "Tensor":
        return Tensor(_located(self._t.log_softmax, axis), self._b)

    def layer_norm(self, gamma=None, beta=None, eps: float = 1e-5) -> "Tensor":
        g = None if gamma is None else self._lift(gamma)._t
        b = None if beta is None else self._lift(beta)._t
        return Tensor(_located(self._t.layer_norm, g, b, eps), self._b)

    def rms_norm(self, gamma=None, eps: float = 1e-6) -> "Tensor":
        g = None if gamma is None else self._lift(gamma)._t
        return Tensor(_located(self._t.rms_norm, g, eps), self._b)

    def conv2d(self, weight, bias=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups: int = 1) -> "Tensor":
        """NCHW convolution; ``padding`` is (top, left, bottom, right)."""
        w = self._lift(weight)._t
        b = None if bias is None else self._lift(bias)._t
        return Tensor(
            _located(self._t.conv2d, w, b, tuple(stride), tuple(padding), tuple(dilation), groups),
            self._b,
        )

    def __repr__(self) -> str:
        return f"<tenet.Tensor {self.dtype}{self.shape}>"

    def __bool__(self):
        raise TenetError("a lazy tensor has no truth value until its graph runs")


class GraphBuilder:
    """Builds a graph lazily: inputs, constants and ops on ``Tensor``s, then ``finish``."""

    def __init__(self):
        self._b = _native.GraphBuilder()

    def input(self, name: str, dtype: str, shape: Sequence[int]) -> Tensor:
        """A named graph input of ``dtype`` (``f32``, ``f16``, ``bf16``, ``i32``, ``i64``,
        ``u8``, ``bool``) and ``shape``."""
        return Tensor(_located(self._b.input, name, dtype, [int(d) for d in shape]), self)

    def constant(self, value, dtype: Optional[str] = None) -> Tensor:
        """A constant from an array (at most 1 MiB; larger tensors belong in weights)."""
        a = np.asarray(value)
        if dtype is not None:
            a = a.astype(_NUMPY[dtype])
        elif a.dtype == np.float64:
            a = a.astype(np.float32)  # a Python float or a float64 literal: tenet's f32
        data, dt, shape = _raw("constant", a)
        return Tensor(_located(self._b.constant, data, dt, shape), self)

    def concat(self, xs: Sequence[Tensor], axis: int = 0) -> Tensor:
        return Tensor(_located(self._b.concat, [x._t for x in xs], axis), self)

    def gradients(self, loss: Tensor, wrt: Sequence[Tensor]) -> List[Tensor]:
        """``d loss / d x`` for each ``x`` of ``wrt``, built into this graph by reverse-mode
        autodiff (``loss`` a scalar f32; each gradient has its variable's shape)."""
        grads = _located(self._b.gradients, loss._t, [x._t for x in wrt])
        return [Tensor(g, self) for g in grads]

    def finish(self, outputs: Mapping[str, Tensor]) -> Graph:
        """The validated graph with these named outputs."""
        pairs = [(name, t._t) for name, t in outputs.items()]
        return Graph(_located(self._b.finish, pairs))


# ---------------------------------------------------------------------------------------------
# The network: deploy a graph to a coordinator, call it, check the receipt.


def _json_tensor(name: str, value, want: Optional[str] = None) -> dict:
    """An array as the coordinator's JSON tensor ``{"dtype", "shape", "data"}``; non-finite
    floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    data, dt, shape = _raw(name, value, want)
    a = np.frombuffer(data, dtype=_NUMPY[dt])
    flat = a.tolist()
    if dt in ("f32", "f16"):
        flat = [v if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf")) for v in flat]
    return {"dtype": dt, "shape": shape, "data": flat}


def _from_json_tensor(v: dict) -> np.ndarray:
    dt = v["dtype"]
    if dt == "bf16":
        np_dt = np.dtype(np.float32)
    else:
        np_dt = _NUMPY[dt]
    data = [float(x) if isinstance(x, str) else x for x in v["data"]]
    return np.array(data, dtype=np_dt).reshape(v["shape"])


def verify_receipt(receipt: Union[dict, str], coordinator_key: str, outputs: Optional[Mapping[str, object]] = None) -> None:
    """Check a receipt offline: signed by the coordinator whose public key (hex) is given and,
    when ``outputs`` are given, committing to exactly those outputs. Raises ``TenetError``
    when it does not verify."""
    text = receipt if isinstance(receipt, str) else json.dumps(receipt)
    raw = None if outputs is None else {k: _raw(k, v) for k, v in outputs.items()}
    _native.verify_receipt(text, coordinator_key, raw)


class CallResult:
    """A verified call: the agreed outputs, the signed receipt, the job's id, and the nodes
    slashed for disagreeing."""

    def __init__(self, outputs: Dict[str, np.ndarray], receipt: dict, job_id: str, slashed: list):
        self.outputs = outputs
        self.receipt = receipt
        self.job_id = job_id
        self.slashed = slashed

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    def __repr__(self) -> str:
        return f"<tenet.CallResult job {self.job_id}: {sorted(self.outputs)}, {len(self.slashed)} slashed>"


class Client:
    """A coordinator's REST API: ``deploy`` graphs, ``call`` them on several nodes, and get
    results whose receipt has been checked against the coordinator's key."""

    def __init__(self, url: str, api_key: Optional[str] = None, key: Optional[PathLike] = None, timeout: float = 60.0):
        """``api_key``: one of the coordinator's API keys (sent as a bearer token). ``key``: a
        key file (``tenet key new``) whose public key the coordinator trusts; every request
        is then signed with it."""
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.key = None if key is None else os.fspath(key)
        self.timeout = timeout
        self._key: Optional[str] = None

    def _request(self, method: str, path: str, body: Optional[bytes] = None, content_type: str = "application/json", timeout: Optional[float] = None):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("content-type", content_type)
        if self.api_key:
            req.add_header("authorization", f"Bearer {self.api_key}")
        if self.key:
            for name, value in _native.auth_headers(self.key, method, path, body or b""):
                req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                data = r.read()
                return r.status, data
        except urllib.error.HTTPError as e:
            data = e.read()
            try:
                err = json.loads(data)
                msg = err.get("error", err)
                if isinstance(msg, dict):
                    msg = msg.get("message", msg)
            except ValueError:
                msg = data.decode(errors="replace")
            raise TenetError(f"the coordinator refused {method} {path} ({e.code}): {msg}") from None
        except urllib.error.URLError as e:
            raise TenetError(f"cannot reach the coordinator at {self.url}: {e.reason}") from None

    def _json(self, method: str, path: str, body=None, content_type: str = "application/json", timeout=None):
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        _, data = self._request(method, path, body, content_type, timeout)
        return json.loads(data) if data else None

    @property
    def coordinator_key(self) -> str:
        """The coordinator's public key (hex), from its ``/v1/info``."""
        if self._key is None:
            self._key = self._json("GET", "/v1/info")["coordinator"]
        return self._key

    def upload(self, data: bytes) -> str:
        """Upload a blob unless the coordinator has it; its content address."""
        h = _native.content_hash(bytes(data))
        try:
            self._request("HEAD", f"/v1/blobs/{h}", content_type="application/octet-stream")
        except TenetError:
            self._request("PUT", f"/v1/blobs/{h}", bytes(data), "application/octet-stream", timeout=max(self.timeout, 600))
        return h

    def deploy(self, graph: Graph, weights: Union[None, PathLike, bytes, Iterable[PathLike]] = None) -> str:
        """Upload the graph's weights (its imported ones, or the files given) and deploy it;
        the task's id."""
        blobs: List[bytes] = []
        own = graph._g.imported_weights()
        if own is not None:
            blobs.append(bytes(own))
        if isinstance(weights, (bytes, bytearray)):
            blobs.append(bytes(weights))
        elif weights is not None:
            paths = [weights] if isinstance(weights, (str, os.PathLike)) else list(weights)
            for p in paths:
                with open(os.fspath(p), "rb") as f:
                    blobs.append(f.read())
        for b in blobs:
            self.upload(b)
        task = self._json("POST", "/v1/tasks", bytes(graph._g.to_bytes()), "application/octet-stream")
        return task["id"]

    def call(self, task: str, inputs: Mapping[str, object], tier: str = "exact", seed: int = 0, wait: float = 600.0) -> CallResult:
        """Run a deployed task on the coordinator's nodes; the agreed outputs, with a receipt
        verified against the coordinator's key and the outputs. ``tier``: ``exact`` or
        ``tolerant``."""
        info = self._json("GET", f"/v1/tasks/{task}")
        declared = {i["name"]: i["dtype"] for i in info.get("inputs", [])}
        body = {
            "inputs": {k: _json_tensor(k, v, declared.get(k)) for k, v in inputs.items()},
            "tier": tier,
            "seed": seed,
        }
        job = self._json("POST", f"/v1/tasks/{task}/run?async=true", body)["job_id"]
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TenetError(f"job {job} did not finish within {wait:.0f} s; ask GET /v1/jobs/{job} later")
            step = min(left, 30.0)
            v = self._json("GET", f"/v1/jobs/{job}?wait={step:.1f}", timeout=step + self.timeout)
            state = v.get("state")
            if state == "decided":
                break
            if state == "failed":
                raise TenetError(f"job {job} failed: {v.get('error', 'no reason given')}")
        outputs = {k: _from_json_tensor(t) for k, t in (v.get("outputs") or {}).items()}
        receipt = v["receipt"]
        verify_receipt(receipt, self.coordinator_key, outputs)
        return CallResult(outputs, receipt, job, v.get("slashed") or [])


# ---------------------------------------------------------------------------------------------
# The bundled models (`tenet models fetch minilm smollm2`), loaded once per process.


def grad(graph: Graph, loss: str, wrt: Sequence[str]) -> Graph:
    """``graph`` extended with the gradient of its scalar f32 output ``loss`` with respect to
    each input named in ``wrt``: its outputs are the graph's own, then ``grad/<name>``."""
    return Graph(_located(_native.grad, graph._g, loss, list(wrt)))


def train(
    dataset: str,
    model="mlp",
    seed: int = 0,
    epochs: Optional[int] = None,
    batch: int = 32,
    shards: int = 1,
    optimizer: str = "adamw",
    lr: Optional[float] = None,
    out: PathLike = "tenet-train",
    threads: Optional[int] = None,
    device: str = "cpu",
) -> dict:
    """Train a model — ``"mlp"``, ``"cnn"``, or a list of ``tenet.nn`` layers — on a fetched
    dataset (``digits`` or ``mnist``: ``tenet models fetch digits``), as ``tenet train`` does:
    the same seed gives the same ``weights_hash`` on every machine and thread count. Returns
    the report: ``test_accuracy``, ``final_loss``, ``steps``, ``weights_hash``, and the files
    written under ``out``."""
    if not isinstance(model, str):
        model = [layer.spec() if hasattr(layer, "spec") else tuple(layer) for layer in model]
    return _native.train(dataset, model, seed, epochs, batch, shards, optimizer, lr, str(out), threads, device)


def embed(sentences: Union[str, Sequence[str]], threads: Optional[int] = None, device: str = "cpu") -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings: a float32 array ``[len(sentences), 384]``, the
    same bits at any thread count."""
    if isinstance(sentences, str):
        sentences = [sentences]
    sentences = list(sentences)
    if not sentences:
        raise TenetError("give at least one sentence to embed")
    v = _native.embed(sentences, threads, device)
    return np.array(v, dtype=np.float32).reshape(len(sentences), -1)


def generate(
    prompt: str,
    max_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    chat: bool = False,
    threads: Optional[int] = None,
    device: str = "cpu",
    return_tokens: bool = False,
    arithmetic: str = "exact",
):
    """SmolLM2-135M-Instruct's continuation of ``prompt`` (greedy when ``temperature`` is 0,
    else sampled from ``seed``: the same text on every machine). ``chat`` applies the model's
    chat template. ``arithmetic`` is ``"exact"`` (the f32 model's tokens) or ``"q8"``
    (activations rounded to 8-bit blocks, llama.cpp's arithmetic: about twice as fast on a CPU,
    with tokens of its own; what an LLM deployed with ``--arithmetic q8`` serves). Returns the
    text, or ``(text, token_ids)`` with ``return_tokens``."""
    text, tokens = _native.generate(
        prompt, max_tokens, temperature, top_p, seed, chat, threads, device, arithmetic
    )
    return (text, tokens) if return_tokens else text


from .remote import RemoteTensor, Session, remote  # noqa: E402  (needs the names above)
from . import nn  # noqa: E402

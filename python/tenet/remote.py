"""Eager tensors on a node: ``with tenet.remote(url) as r: a = r.tensor(x); (a @ a).relu().numpy()``.

Tensors stay resident in a session on the node. Operations are not sent one by one: they are
recorded into a graph, and when a value is read the node gets, in one batch, the uploads made
since the last read, one ``run`` of that graph (whose outputs — every recorded tensor still
referenced — become resident), and the ``get`` of the value. So 1000 small ops and a read cost
one batch (plus storing the recorded graph as a blob), not 1000 round trips. The results are
the graph's, so they have the same bits as the lazy builder and as any other machine.
``tenet.remote("local")`` starts a node on 127.0.0.1 for the block and stops it after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import weakref
from typing import Dict, List, Optional

import numpy as np

from . import _native
from ._native import TenetError


class RemoteTensor:
    """A tensor of a remote session: resident on the node, or recorded and not yet run."""

    __slots__ = ("_s", "_res", "_sym", "_epoch", "__weakref__")

    def __init__(self, session: "Session", res: Optional[str] = None, sym=None):
        self._s = session
        self._res = res
        self._sym = sym
        self._epoch = session._epoch

    @property
    def dtype(self) -> str:
        return self._s._sym(self).dtype

    @property
    def shape(self) -> List[int]:
        return self._s._sym(self).shape

    def numpy(self) -> np.ndarray:
        """The value: runs what was recorded (one batch) and downloads this tensor."""
        return self._s._read(self)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        state = f"resident as {self._res}" if self._res else "recorded"
        return f"<tenet.RemoteTensor {self.dtype}{self.shape}, {state}>"


def _forward(name: str):
    def op(self: RemoteTensor, *args, **kwargs):
        s = self._s
        args = [s._sym(a) if isinstance(a, RemoteTensor) else a for a in args]
        kwargs = {k: s._sym(v) if isinstance(v, RemoteTensor) else v for k, v in kwargs.items()}
        return s._record(getattr(s._sym(self), name)(*args, **kwargs))

    op.__name__ = name
    op.__doc__ = f"As ``tenet.Tensor.{name}``, recorded for the node."
    return op


_OPS = [
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__pow__", "__matmul__", "__rmatmul__", "__neg__", "__lt__", "__le__",
    "__gt__", "__ge__", "eq", "ne", "maximum", "minimum", "logical_and", "logical_or", "matmul",
    "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu",
    "gelu", "gelu_tanh", "erf", "floor", "ceil", "round", "sign", "logical_not", "where", "cast",
    "reshape", "permute", "transpose", "expand", "slice", "gather", "sum", "mean", "max", "min",
    "argmax", "argmin", "softmax", "log_softmax", "layer_norm", "rms_norm", "conv2d",
]
for _name in _OPS:
    setattr(RemoteTensor, _name, _forward(_name))


class Session:
    """A session on one node; see the module's documentation."""

    def __init__(self, url: str, process: Optional[subprocess.Popen] = None, workdir=None):
        from . import GraphBuilder

        self._GraphBuilder = GraphBuilder
        self.url = url
        self._process = process
        self._workdir = workdir
        self._conn = _native.NodeConnection(url)
        self._sid = self._conn.create_session()
        self._count = 0
        self._epoch = 0
        self._ops: List[dict] = []  # puts and frees waiting for the next batch
        # dtype and shape of every resident tensor, by its name on the node
        self._inputs_type: Dict[str, tuple] = {}
        self._reset()
        self.batches = 0

    @property
    def requests(self) -> int:
        """HTTP requests sent to the node so far."""
        return self._conn.requests

    def _reset(self):
        self._b = self._GraphBuilder()
        self._inputs: Dict[str, object] = {}
        self._recorded: List[weakref.ref] = []
        self._epoch += 1

    def _name(self) -> str:
        self._count += 1
        return f"t{self._count}"

    def tensor(self, value) -> RemoteTensor:
        """Upload an array (with the next batch) as a resident tensor."""
        from . import _raw

        data, dt, shape = _raw("tensor", value)
        name = self._name()
        blob = _native.tensor_blob((data, dt, shape))
        self._ops.append({"op": "put", "name": name, "blob": blob.hex()})
        t = RemoteTensor(self, res=name)
        self._inputs_type[name] = (dt, shape)
        weakref.finalize(t, self._free, name)
        return t

    def _free(self, name: str):
        self._ops.append({"op": "free", "name": name})

    def _sym(self, t: RemoteTensor):
        if t._res is None:
            if t._epoch != self._epoch:
                raise TenetError("a recorded tensor outlived its session's graph")
            return t._sym
        if t._res not in self._inputs:
            dt, shape = self._inputs_type[t._res]
            self._inputs[t._res] = self._b.input(t._res, dt, shape)
        return self._inputs[t._res]

    def _record(self, sym) -> RemoteTensor:
        t = RemoteTensor(self, sym=sym)
        self._recorded.append(weakref.ref(t))
        return t

    def _read(self, want: RemoteTensor) -> np.ndarray:
        from . import _array

        live = [r() for r in self._recorded]
        live = [t for t in live if t is not None and t._res is None]
        ops = list(self._ops)
        named = []
        if live:
            outputs = {}
            for t in live:
                name = self._name()
                outputs[name] = t._sym
                named.append((name, t))
            graph = self._b.finish(outputs)
            task = self._conn.put_blob(bytes(graph._g.to_bytes()))
            ops.append({
                "op": "run",
                "task": task,
                "inputs": {n: n for n in self._inputs},
                "outputs": {n: n for n, _ in named},
            })
        for name, t in named:
            dt, shape = t._sym.dtype, t._sym.shape
            self._inputs_type[name] = (dt, shape)
        target = want._res or next(n for n, t in named if t is want)
        ops.append({"op": "get", "name": target})
        answer = json.loads(self._conn.batch(self._sid, json.dumps({"ops": ops})))
        self.batches += 1
        self._ops = []
        if answer.get("error"):
            e = answer["error"]
            raise TenetError(f"the node refused operation {e.get('index')}: {e.get('message')}")
        for name, t in named:
            t._res, t._sym = name, None
            weakref.finalize(t, self._free, name)
        self._reset()
        blob = bytes.fromhex(answer["results"][-1]["blob"])
        return _array(_native.tensor_from_blob(blob))

    def close(self):
        try:
            self._conn.delete_session(self._sid)
        except TenetError:
            pass
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._workdir is not None:
            self._workdir.cleanup()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tenet_binary() -> str:
    path = os.environ.get("TENET_BIN") or shutil.which("tenet")
    if not path:
        raise TenetError("tenet.remote(\"local\") needs the tenet binary: put it on PATH or set TENET_BIN")
    return path


def remote(url: str = "local", threads: int = 1) -> Session:
    """A session on the node at ``url``, or on a node started on 127.0.0.1 (``"local"``, open
    to loopback only, ``threads`` worker threads) for as long as the session lives."""
    if url != "local":
        return Session(url)
    work = tempfile.TemporaryDirectory(prefix="tenet-local-node-")
    p = subprocess.Popen(
        [_tenet_binary(), "node", "--open", "--listen", "127.0.0.1:0", "--threads", str(threads),
         "--no-fsync", "--data-dir", work.name],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        err = p.stderr.read()
        work.cleanup()
        raise TenetError(f"the local node did not start: {line}{err}")
    return Session(line.strip().rsplit(" ", 1)[1], process=p, workdir=work)

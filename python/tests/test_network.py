"""tenet.Client against a real network on 127.0.0.1: a coordinator and three nodes (one told to
lie), started as processes of the tenet binary (TENET_BIN, or target/debug/tenet). A graph
built in Python is deployed with its weights and called; the agreed outputs equal a local run
bit for bit, the receipt verifies offline (and a tampered one does not), and the liar is
slashed."""

import copy
import os
import pathlib
import subprocess

import numpy as np
import pytest

import tenet

REPO = pathlib.Path(__file__).resolve().parents[2]
TENET = os.environ.get("TENET_BIN", str(REPO / "target" / "debug" / "tenet"))


def spawn(args):
    p = subprocess.Popen([TENET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on http://" not in line:
        p.kill()
        raise RuntimeError(f"tenet {' '.join(args)} did not start: {line}{p.stderr.read()}")
    return p, line.strip()


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    if not os.path.exists(TENET):
        pytest.skip(f"no tenet binary at {TENET} (build it, or set TENET_BIN)")
    tmp = tmp_path_factory.mktemp("net")
    procs = []
    try:
        coord, line = spawn(["coordinator", "--open", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / "c")])
        procs.append(coord)
        url = line.rsplit(" ", 1)[1]
        key = line.split()[2]
        for i in range(3):
            extra = ["--cheat", "flip"] if i == 1 else []
            node, _ = spawn([
                "node", "--listen", "127.0.0.1:0", "--threads", "1", "--no-fsync",
                "--data-dir", str(tmp / f"n{i}"), "--trust", key,
                "--coordinator", url, "--stake", "1000", *extra,
            ])
            procs.append(node)
        yield url, key
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_deploy_call_and_verify(network, tmp_path):
    url, key = network
    rng = np.random.default_rng(7)
    g = tenet.GraphBuilder()
    x = g.input("x", "f32", [4, 16])
    w = g.constant(rng.standard_normal((16, 8)).astype(np.float32))
    graph = g.finish({"y": (x @ w).tanh()})
    client = tenet.Client(url)
    assert client.coordinator_key == key
    task = client.deploy(graph)
    xv = rng.standard_normal((4, 16)).astype(np.float32)
    result = client.call(task, {"x": xv})
    local = graph.run({"x": xv})
    assert result["y"].tobytes() == local["y"].tobytes()
    # The liar disagreed with the majority and was slashed.
    assert len(result.slashed) == 1, result.slashed
    # The receipt checks offline, and only for these outputs and this coordinator.
    tenet.verify_receipt(result.receipt, key, result.outputs)
    with pytest.raises(tenet.TenetError, match="not what the receipt commits to"):
        tenet.verify_receipt(result.receipt, key, {"y": result["y"] + 1})
    forged = copy.deepcopy(result.receipt)
    forged["replicas"] = forged["replicas"] + 1
    with pytest.raises(tenet.TenetError, match="does not verify"):
        tenet.verify_receipt(forged, key)
    with pytest.raises(tenet.TenetError):
        tenet.verify_receipt(result.receipt, "00" * 32)


def test_an_imported_model_with_weights_deploys(network):
    url, _ = network
    model = REPO / "fuzz" / "corpus" / "import_onnx" / "seed-test_relu.onnx"
    graph = tenet.import_onnx(model)
    client = tenet.Client(url)
    task = client.deploy(graph)
    x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(3, 4, 5)
    assert np.array_equal(client.call(task, {"x": x})["y"], np.maximum(x, 0))
    mlp = tenet.load(REPO / "examples" / "mlp.tg", weights=REPO / "examples" / "mlp.safetensors")
    task = client.deploy(mlp, weights=REPO / "examples" / "mlp.safetensors")
    (name, _, shape), = mlp.inputs
    xv = np.ones(shape, np.float32)
    assert client.call(task, {name: xv})[mlp.outputs[0][0]].tobytes() == mlp.run({name: xv})[mlp.outputs[0][0]].tobytes()


def test_errors_come_back_as_tenet_errors(network):
    url, _ = network
    client = tenet.Client(url)
    with pytest.raises(tenet.TenetError, match="refused"):
        client.call("0" * 64, {"x": np.zeros(1, np.float32)})
    with pytest.raises(tenet.TenetError, match="cannot reach"):
        tenet.Client("http://127.0.0.1:9").coordinator_key


def test_a_client_signs_with_a_key_the_coordinator_trusts(tmp_path):
    if not os.path.exists(TENET):
        pytest.skip(f"no tenet binary at {TENET}")
    keyfile = tmp_path / "client.key"
    made = subprocess.run([TENET, "key", "new", str(keyfile)], capture_output=True, text=True, check=True)
    public = made.stdout.split()[-1]
    coord, line = spawn(["coordinator", "--trust", public, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "c")])
    try:
        url = line.rsplit(" ", 1)[1]
        g = tenet.GraphBuilder()
        x = g.input("x", "f32", [2])
        graph = g.finish({"y": x * 2.0})
        with pytest.raises(tenet.TenetError, match="refused"):
            tenet.Client(url).deploy(graph)
        task = tenet.Client(url, key=keyfile).deploy(graph)
        assert task == graph.id
        other = tmp_path / "other.key"
        subprocess.run([TENET, "key", "new", str(other)], capture_output=True, check=True)
        with pytest.raises(tenet.TenetError, match="refused"):
            tenet.Client(url, key=other).deploy(graph)
    finally:
        coord.terminate()
        coord.wait(timeout=10)

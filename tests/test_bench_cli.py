"""python -m flux_dnn bench (issue 29): the table, the check against the peer, the rows in
JSON, a line per row on stderr, and the errors of bad arguments. No assertion on time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _bench, _bench_cli, _bench_peers


def _bench_run(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")  # steadier on a shared machine; nothing timed is checked
    env.pop("FLUX_DNN_PROGRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "flux_dnn", "bench", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # flux_dnn as installed, not a source tree
        env=env,
        timeout=600,
    )


def _table(stdout: str) -> list:
    """The table's rows as lists of cells (the header row and the separator excluded)."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_quick_run_with_torch_prints_its_table(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "rows.json"
    run = _bench_run(tmp_path, "--quick", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    header = [line for line in run.stdout.splitlines() if line.startswith("# ")]
    assert "vs torch" in header[0] and "on cpu" in header[0]
    assert any(line.startswith("# machine: CPU: ") for line in header), header
    assert any(line.startswith("# shim: float32 -> ") for line in header), header
    assert any(line.startswith("# command: python -m flux_dnn bench --quick") for line in header)
    table_head = next(line for line in run.stdout.splitlines() if line.startswith("| layer"))
    assert "torch ms" in table_head and "torch / flux_dnn" in table_head and "check" in table_head
    rows = _table(run.stdout)
    measured, geomean = rows[:-1], rows[-1]
    assert len(measured) == 3 * 3  # --quick: three layers of resnet50, three ops, float32
    assert {r[1] for r in measured} == set(_bench_cli.OPS)
    for r in measured:
        assert len(r) == len(rows[0]) == 10
        assert r[-1] == "ok", r  # flux_dnn's result agrees with torch's
        assert float(r[5]) > 0 and float(r[6]) > 0 and float(r[7]) > 0
    assert geomean[0].startswith("geomean of 9 rows") and float(geomean[7]) > 0
    progress = [line for line in run.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 9 and progress[0].startswith("[1/9] ") and progress[-1].startswith("[9/9] ")
    saved = json.loads(out.read_text())
    assert len(saved["rows"]) == 9 and saved["summary"]["mismatched"] == 0
    assert all(r["max_rel_diff"] <= _bench_cli.TOLERANCE["float32"] and r["peer_ms"] > 0 for r in saved["rows"])
    assert saved["machine"]["peer"] == "torch" and saved["machine"]["cpu"]["model"]


def test_numpy_reference_checks_every_op(tmp_path, capsys):
    """The NumPy peer (no torch or JAX): flux_dnn's results against float64, strides,
    padding, groups, both layouts; times are flux_dnn's alone."""
    out = tmp_path / "rows.json"
    argv = ["--peer", "numpy", "--shape", "c=4,h=9,k=6,r=3,stride=2,groups=2", "--shape", "c=3,h=5,k=2,r=1"]
    argv += ["--dtypes", "float32,float64", "--layout", "nchw,nhwc", "--budget", "0.01", "--json", str(out)]
    assert _bench_cli.main(argv) == 0
    captured = capsys.readouterr()
    rows = _table(captured.out)
    assert len(rows) == 2 * 2 * 2 * 3 and all(r[-1] == "ok" for r in rows)
    assert "numpy ms" not in captured.out and "NumPy float64 reference" in captured.out
    assert len([line for line in captured.err.splitlines() if line.startswith("[")]) == len(rows)
    assert json.loads(out.read_text())["summary"]["failed"] == 0


@pytest.mark.parametrize("peer", ["torch", "jax"])
def test_each_peer_agrees_in_every_dtype_layout_and_op(peer, capsys):
    """A small grouped, strided layer against torch and JAX: every row checked ok."""
    pytest.importorskip(peer)
    argv = ["--peer", peer, "--shape", "c=4,h=9,k=6,r=3,stride=2,groups=2", "--batch", "2", "--budget", "0.01"]
    argv += ["--dtypes", "float32,float16,bfloat16" + (",float64" if peer == "torch" else ""), "--layout", "nchw,nhwc"]
    assert _bench_cli.main(argv + ["--no-progress"]) == 0, capsys.readouterr().out
    rows = _table(capsys.readouterr().out)[:-1]
    assert len(rows) == (4 if peer == "torch" else 3) * 2 * 3 and all(r[-1] == "ok" for r in rows)


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_numpy_reference_agrees_with_flux_dnn_in_float64(op, rng):
    """The reference of the NumPy peer is right: float64, a strided, padded, grouped layer."""
    layer = _bench.parse_shape("c=6,h=11,k=4,r=3,stride=2,pad=2,groups=2")
    case = _bench_peers.NumpyPeer("cpu", "heuristic").case(op, layer, 2, "float64", "nchw")
    np.testing.assert_allclose(case["flux"](), case["expected"](), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "--device: unknown device 'tpu'; allowed: cpu, cuda, rocm, mps, xpu"),
        (["--peer", "mxnet"], "--peer: unknown peer 'mxnet'; allowed: auto, torch, jax, numpy"),
        (["--layers", "vgg"], "--layers: unknown layer set 'vgg'; allowed: resnet50, resnet50-sample, mobilenet"),
        (["--dtypes", "float32,int8"], "--dtypes: unknown value 'int8'; allowed: float32, float16, bfloat16, float64"),
        (["--ops", "backward"], "--ops: unknown value 'backward'"),
        (["--layout", "nc"], "--layout: unknown value 'nc'; allowed: nchw, nhwc"),
        (["--algorithm", "fastest"], "--algorithm: 'fastest' is not one of heuristic, benchmark"),
        (["--batch", "0"], "--batch: 0 is not a batch size"),
        (["--shape", "c=3,h=8"], "--shape: 'c=3,h=8' lacks k, r"),
        (["--shape", "c=3,h=8,k=4,r=3,x=1"], "--shape: 'x=1' in 'c=3,h=8,k=4,r=3,x=1' is not KEY=VALUE"),
        (["--shape", "c=3,h=8,k=4,r=three"], "--shape: r='three' in"),
        (["--shape", "c=3,h=8,k=4,r=3,groups=2"], "is not a convolution"),
        (["--shape", "c=3,h=2,k=4,r=5,pad=0"], "leaves no output"),
        (["--peer", "numpy", "--device", "cuda"], "--device: 'cuda' needs torch or JAX installed"),
    ],
)
def test_bad_arguments_name_the_argument_the_value_and_what_is_allowed(argv, message):
    with pytest.raises(SystemExit) as exc:
        _bench_cli.main(argv)
    assert message in str(exc.value)


def test_layer_sets_and_quick_subsets():
    for name, layers in _bench.LAYER_SETS.items():
        assert len({layer.name for layer in layers}) == len(layers)
        assert set(_bench.QUICK[name]) <= {layer.name for layer in layers}, name
        for layer in layers:
            assert layer.C % layer.groups == 0 and layer.K % layer.groups == 0
            assert _bench.out_size(layer.H, layer.R, layer.stride, layer.pad) >= 1
    assert _bench.parse_shape("c=64,h=56,k=64,r=3") == _bench.Layer("3x3 64->64 @56", 64, 56, 64, 3, 1, 1, 1)


def test_interleaved_gives_each_callable_its_median_and_counts():
    calls = {"a": 0, "b": 0}

    def count(name):
        calls[name] += 1

    t = _bench.interleaved({n: (lambda n=n: count(n)) for n in calls}, 0.0, 7, 7, warmup=2)
    assert t["_reps a"] == t["_reps b"] == t["_reps"] == 7
    assert calls == {"a": 2 + 1 + 7, "b": 2 + 1 + 7}  # warm-up, the probe round, the timed rounds
    assert t["a"] >= 0 and t["_min a"] <= t["a"]


def test_main_lists_bench(capsys):
    from flux_dnn.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out
    assert flux_dnn.__version__

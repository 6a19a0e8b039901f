#!/usr/bin/env python
"""Per-call overhead of a tiny convolution, piece by piece (an analysis aid, not a test).

Times flux_dnn.conv2d / conv_transpose2d / conv_plan on NumPy and torch against torch's
F.conv2d on x 1x4x8x8, w 4x4x3x3, pad 1, and the pieces a call is made of: the core call
alone (flux_dnn._core.run_conv with the prepared spec, read from flux_dnn internals), DLPack
export, output allocation, memo keys. Prints a markdown table of minimum and median µs per
call.

    OMP_NUM_THREADS=1 python benchmarks/overhead.py              # times, every row
    OMP_NUM_THREADS=1 python benchmarks/overhead.py --rows numpy # rows whose name has "numpy"

Times on a shared machine move with its load; instruction counts do not:

    python benchmarks/overhead.py --callgrind --rows numpy

runs each row under ``valgrind --tool=callgrind`` (one thread) twice, with --calls and twice
as many calls, and prints instructions per call (the difference over the extra calls, so that
start-up and the first call drop out). With --split, where the libraries have symbols (an
unstripped build, e.g. ``pip install --target DIR . -C cmake.build-type=RelWithDebInfo
-C install.strip=false`` and PYTHONPATH=DIR), it also splits each call into the core call
(pybind11 + _core + shim), the shim's execute and the vendor library below it, and Python.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import flux_dnn
from flux_dnn import _conv, _core

SHAPE_X, SHAPE_W = (1, 4, 8, 8), (4, 4, 3, 3)


def _prepared(*arrays, **kwargs):
    """The memo entry (shim, spec) flux_dnn made for conv2d(*arrays, padding=1, **kwargs)."""
    _conv._memo.clear()
    flux_dnn.conv2d(*arrays, padding=1, **kwargs)
    ((_, prepared),) = _conv._memo.items()
    return prepared


def numpy_rows() -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE_X, dtype=np.float32)
    w = rng.standard_normal(SHAPE_W, dtype=np.float32)
    y = np.empty(SHAPE_X, np.float32)
    p, p0 = _prepared(x, w), _prepared(x, w, algorithm=0)
    plan = flux_dnn.conv_plan(x, w, padding=1)
    adapter = _conv._BY_TYPE[type(x)]
    return {
        "flux conv2d numpy": lambda: flux_dnn.conv2d(x, w, padding=1),
        "flux conv2d numpy, algorithm=0 (gemm, no reorder)": lambda: flux_dnn.conv2d(x, w, padding=1, algorithm=0),
        "flux conv2d numpy out=": lambda: flux_dnn.conv2d(x, w, padding=1, out=y),
        "flux conv_transpose2d numpy": lambda: flux_dnn.conv_transpose2d(x, w, padding=1),
        "conv_plan numpy": lambda: plan(x),
        "conv_plan numpy out=": lambda: plan(x, out=y),
        "_core.run_conv numpy (core+shim+oneDNN)": lambda: _core.run_conv(p.shim, p.spec, x, w, y, None, None, None),
        "_core.run_conv numpy, algorithm=0": lambda: _core.run_conv(p0.shim, p0.spec, x, w, y, None, None, None),
        "numpy a.__dlpack__(max_version=(1,0))": lambda: x.__dlpack__(max_version=(1, 0)),
        "np.empty": lambda: np.empty(SHAPE_X, np.float32),
        "NumpyAdapter.key(a) x1": lambda: adapter.key(x),
    }


def torch_rows() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.utils.dlpack import to_dlpack

    import flux_dnn.torch as ft

    torch.manual_seed(0)
    x, w, y = torch.randn(SHAPE_X), torch.randn(SHAPE_W), torch.empty(SHAPE_X)
    p = _prepared(x, w)
    plan = flux_dnn.conv_plan(x, w, padding=1)
    adapter = _conv._BY_TYPE[type(x)]
    return {
        "torch F.conv2d": lambda: F.conv2d(x, w, None, 1, 1),
        "flux conv2d torch": lambda: flux_dnn.conv2d(x, w, padding=1),
        "flux.torch conv2d (autograd.Function)": lambda: ft.conv2d(x, w, None, 1, 1),
        "conv_plan torch": lambda: plan(x),
        "conv_plan torch out=": lambda: plan(x, out=y),
        "_core.run_conv torch (exchange API)": lambda: _core.run_conv(p.shim, p.spec, x, w, y, None, None, None),
        "torch t.__dlpack__(max_version=(1,0))": lambda: x.__dlpack__(max_version=(1, 0)),
        "torch.utils.dlpack.to_dlpack(t)": lambda: to_dlpack(x),
        "torch.empty(shape, dtype=)": lambda: torch.empty(SHAPE_X, dtype=x.dtype),
        "TorchAdapter.key(t) x1": lambda: adapter.key(x),
    }


def rows(patterns: str) -> dict:
    """The rows whose name contains one of the comma-separated patterns (all rows for "");
    torch is imported only for its rows."""
    wanted = {}
    patterns = [p.strip() for p in patterns.split(",")] if patterns else [""]
    if any("torch" in p or not p for p in patterns):
        try:
            wanted.update(torch_rows())
        except ImportError:
            print("torch is not installed: its rows are left out", file=sys.stderr)
    wanted.update(numpy_rows())
    return {name: fn for name, fn in wanted.items() if any(p in name for p in patterns)}


def time_row(fn, n=5000, blocks=15) -> tuple:
    for _ in range(500):
        fn()
    per_call = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / n / 1e3)
    per_call.sort()
    return per_call[0], per_call[len(per_call) // 2]


# ------------------------------------------------------------------------------------------
# Instruction counts (callgrind)

# Where a call's instructions go, by the functions callgrind names (inclusive counts). The
# core call is everything under pybind11's dispatcher; the shim's execute everything under
# its plan_execute; the vendor library what the shim calls into it.
SPLIT = {
    "core call (pybind11 + _core + shim + vendor)": r"pybind11::cpp_function::dispatcher",
    "fdnn_core::run_conv / PackedConv::run": r"fdnn_core::(run_conv|PackedConv::run)\(",
    "shim plan_execute (shim + vendor)": r"plan_execute\(",
    "oneDNN primitive execute (vendor)": r"dnnl_primitive_execute|dnnl::primitive::execute",
}


def _callgrind(row: str, calls: int, out: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--run", row, "--calls", str(calls)]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _total(out: str) -> int:
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"{out}: no totals line")


def _inclusive(out: str) -> dict:
    """Inclusive instruction counts of the SPLIT functions (0 where callgrind has no name)."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    found = dict.fromkeys(SPLIT, 0)
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\S*?:?(.*)", line)
        if not match:
            continue
        count, name = int(match.group(1).replace(",", "")), match.group(2)
        for label, pattern in SPLIT.items():
            if re.search(pattern, name):
                found[label] = max(found[label], count)
    return found


def count_rows(names: list, calls: int, split: bool) -> None:
    print(f"Instructions per call (callgrind, one thread, {calls} extra calls)")
    if split:
        print("| call | total | " + " | ".join(SPLIT) + " | Python and the rest |")
        print("|---|---:|" + "---:|" * (len(SPLIT) + 1))
    else:
        print("| call | instructions |")
        print("|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            few, many = os.path.join(tmp, "few.out"), os.path.join(tmp, "many.out")
            _callgrind(name, calls, few)
            _callgrind(name, 2 * calls, many)
            total = (_total(many) - _total(few)) / calls
            if not split:
                print(f"| {name} | {total:,.0f} |", flush=True)
                continue
            a, b = _inclusive(few), _inclusive(many)
            parts = {label: (b[label] - a[label]) / calls for label in SPLIT}
            rest = total - parts[next(iter(SPLIT))]
            cells = " | ".join(f"{v:,.0f}" for v in parts.values())
            print(f"| {name} | {total:,.0f} | {cells} | {rest:,.0f} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="", help="only the rows whose name contains one of these comma-separated texts")
    ap.add_argument("--callgrind", action="store_true", help="instructions per call instead of times")
    ap.add_argument("--split", action="store_true", help="with --callgrind: where the instructions go")
    ap.add_argument("--calls", type=int, default=2000, help="with --callgrind: extra calls counted")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one row, --calls times (under callgrind)
    args = ap.parse_args(argv)
    if args.run:
        fn = (torch_rows() if "torch" in args.run else numpy_rows())[args.run]
        for _ in range(args.calls):
            fn()
        return
    selected = rows(args.rows)
    if args.callgrind:
        count_rows(list(selected), args.calls, args.split)
        return
    print("| call | min µs | median µs |")
    print("|---|---:|---:|")
    for name, fn in selected.items():
        fastest, median = time_row(fn)
        print(f"| {name} | {fastest:.2f} | {median:.2f} |", flush=True)


if __name__ == "__main__":
    main()

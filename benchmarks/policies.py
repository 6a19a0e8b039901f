#!/usr/bin/env python
"""Which oneDNN-shim layout policy is fastest, layer by layer (an exploration aid, not a test).

Times flux_dnn.conv2d forward (or --op backward_data / backward_weight) with algorithm=0
(caller's layouts), 1 (caller's activations, oneDNN-preferred weights) and 2
(oneDNN-preferred layouts with reorders), the heuristic's choice, and
torch.nn.functional.conv2d, interleaved in one process, and prints the kernel each policy
gets. A policy that lands on oneDNN's reference kernel ("ref:any") is not timed
(it is 100x slower). The kernel names come from flux_dnn.conv_plan(...).algorithm.

    OMP_NUM_THREADS=1 python benchmarks/policies.py --batch 1,16 --layouts nchw,nhwc
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux_dnn  # noqa: E402
from bench_cpu import LAYERS, interleaved, machine_text  # noqa: E402


def algo_name(x, w, L, algorithm):
    """(id, kernel name) of the forward plan a policy makes, without running it (a plan object)."""
    plan = flux_dnn.conv_plan(x, w, None, L.stride, L.pad, 1, L.groups, algorithm=algorithm)
    name = plan.algorithm.replace(" [packed weights]", "")
    ids = {"user layouts": 0, "vendor weights": 1, "vendor layouts": 2}
    return next((v for k, v in ids.items() if f"({k})" in name), -1), name


def backward_algo_name(op, x, w, dy, L, algorithm):
    """(id, kernel name) of a backward plan, read from flux_dnn internals by running it once
    on one image (a reference kernel on a whole batch would take minutes)."""
    from flux_dnn import _conv, _core

    x1, dy1 = x[:1], dy[:1]
    _conv._memo.clear()  # a cache: the one entry after the call is this call's
    if op == "backward_data":
        out = flux_dnn.conv_backward_data(dy1, w, tuple(x1.shape), L.stride, L.pad, 1, L.groups, algorithm=algorithm)
        code, ops = _conv.BACKWARD_DATA, (out, w, dy1)
    else:
        out = flux_dnn.conv_backward_weight(x1, dy1, tuple(w.shape), L.stride, L.pad, 1, L.groups, algorithm=algorithm)
        code, ops = _conv.BACKWARD_WEIGHT, (x1, out, dy1)
    ((key, prepared),) = _conv._memo.items()
    assert key[0] == code
    name = _core.plan_info(prepared.shim, prepared.spec, *ops, None)["algo_name"]
    ids = {"user layouts": 0, "vendor weights": 1, "vendor layouts": 2}
    return next((v for k, v in ids.items() if f"({k})" in name), -1), name


def calls(op, x, w, dy, L, algorithm):
    """(flux call, torch call) for one op."""
    s, p, g = L.stride, L.pad, L.groups
    if op == "forward":
        return (
            lambda: flux_dnn.conv2d(x, w, None, s, p, 1, g, algorithm=algorithm),
            lambda: F.conv2d(x, w, None, s, p, 1, g),
        )
    aten = torch.ops.aten.convolution_backward
    if op == "backward_data":
        return (
            lambda: flux_dnn.conv_backward_data(dy, w, tuple(x.shape), s, p, 1, g, algorithm=algorithm),
            lambda: aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, [True, False, False]),
        )
    return (
        lambda: flux_dnn.conv_backward_weight(x, dy, tuple(w.shape), s, p, 1, g, algorithm=algorithm),
        lambda: aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, [False, True, False]),
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--layers", default="")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--op", default="forward", choices=["forward", "backward_data", "backward_weight"])
    ap.add_argument("--budget", type=float, default=1.5)
    ap.add_argument(
        "--stat",
        default="min",
        choices=["min", "median"],
        help="min (default: steadiest on a shared machine) or median of the interleaved calls",
    )
    ap.add_argument("--algos", default="0,1,2", help="flux algorithm ids to time (the shim may know more)")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(f"# {machine_text()}")
    print(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(
        f"# op {args.op}, dtype {args.dtype}, {args.stat} over interleaved calls"
        + ("" if args.op == "forward" else "; kernels probed at N=1")
    )
    print(
        "| N | layout | layer | torch ms | heuristic (id) ms | "
        + " | ".join(f"alg {a} ms" for a in args.algos.split(","))
        + " | best/torch | kernels |"
    )
    print("|---:|---|---|---:|---:|" + "---:|" * len(args.algos.split(",")) + "---:|---|")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in [int(b) for b in args.batch.split(",")]:
            for layout in args.layouts.split(","):
                for L in LAYERS:
                    if args.layers and not any(f in L.name for f in args.layers.split(",")):
                        continue
                    x = torch.randn(n, L.C, L.H, L.H, generator=gen).to(dtype)
                    w = (torch.randn(L.K, L.C // L.groups, L.R, L.R, generator=gen) * 0.1).to(dtype)
                    if layout == "nhwc":
                        x = x.contiguous(memory_format=torch.channels_last)
                        w = w.contiguous(memory_format=torch.channels_last)
                    Ho = (L.H + 2 * L.pad - L.R) // L.stride + 1
                    dy = torch.randn(n, L.K, Ho, Ho, generator=gen).to(dtype)
                    if layout == "nhwc":
                        dy = dy.contiguous(memory_format=torch.channels_last)
                    # bound now, not looked up when called: (id, kernel name) for a policy on this case
                    name_of = (
                        functools.partial(algo_name, x, w, L)
                        if args.op == "forward"
                        else functools.partial(backward_algo_name, args.op, x, w, dy, L)
                    )
                    flux_h, fns = calls(args.op, x, w, dy, L, "heuristic")
                    fns = {"torch": fns}
                    hid, _ = name_of("heuristic")
                    fns["heuristic"] = flux_h
                    kernels = []
                    for a in [int(a) for a in args.algos.split(",")]:
                        try:
                            _, name = name_of(a)
                        except Exception as e:  # noqa: BLE001
                            kernels.append(f"{a}: {type(e).__name__}")
                            continue
                        kernels.append(f"{a}: {name.split(' (')[0]}")
                        if name.startswith("ref"):
                            continue
                        fns[f"alg {a}"] = calls(args.op, x, w, dy, L, a)[0]
                    t = interleaved(fns, args.budget, 7, 300)
                    if args.stat == "min":
                        t = {k: t[f"_min {k}"] for k in fns}
                    best = min(v for k, v in t.items() if k.startswith("alg"))
                    cells = " | ".join(
                        f"{t[f'alg {a}']:.3f}" if f"alg {a}" in t else "ref" for a in args.algos.split(",")
                    )
                    print(
                        f"| {n} | {layout} | {L.name} | {t['torch']:.3f} | {t['heuristic']:.3f} ({hid}) | {cells} | "
                        f"{t['torch'] / best:.2f} | {'; '.join(kernels)} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()

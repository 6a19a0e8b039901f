"""flux_dnn's MPS shim against PyTorch's own MPS convolutions, on one Apple GPU.

The ResNet-50 convolution layers at N=1 and N=16, float32 and float16, NCHW, forward,
backward-data and backward-weight: flux_dnn on torch MPS tensors vs
torch.nn.functional.conv2d / torch.nn.grad.conv2d_input / conv2d_weight on the same tensors,
in the same process. Timing is synchronised: each call is followed by torch.mps.synchronize()
(flux_dnn's MPS shim has finished its command buffer when it returns; torch has only queued
its work), wall-clock per call, the two libraries' calls interleaved (flux_dnn._bench's loop,
shared by every flux_dnn benchmark), median of the repetitions; ratio = torch_time /
flux_time (> 1: flux_dnn faster). Aim on an M-series Mac: geometric mean >= 1.0.

Needs a Mac with MPS (torch.backends.mps.is_available()). Exits 1 when it measured nothing:
no MPS device here, or every measurement failed (scripts/mac_check.sh reads the JSON, written
after every row, for the failures of a partial run). It has not been run yet: no Mac was
available where the shim was written.

    python benchmarks/bench_mps.py [--quick] [--batches 1,16] [--dtypes float32,float16] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from flux_dnn._bench import RESNET50 as LAYERS  # the distinct convolutions of ResNet-50
from flux_dnn._bench import interleaved, synced, write_json

OPS = ("fwd", "bwd_data", "bwd_weight")


def make_calls(torch, flux_dnn, layer, batch, dtype):
    C, K, HW, k, stride, pad = layer.C, layer.K, layer.H, layer.R, layer.stride, layer.pad
    x = torch.randn(batch, C, HW, HW, device="mps", dtype=dtype)
    w = torch.randn(K, C, k, k, device="mps", dtype=dtype) * (1.0 / math.sqrt(C * k * k))
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    dy = torch.randn_like(y)
    geo = dict(stride=stride, padding=pad)
    return {
        "fwd": (lambda: torch.nn.functional.conv2d(x, w, **geo), lambda: flux_dnn.conv2d(x, w, **geo)),
        "bwd_data": (
            lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **geo),
            lambda: flux_dnn.conv_backward_data(dy, w, tuple(x.shape), **geo),
        ),
        "bwd_weight": (
            lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **geo),
            lambda: flux_dnn.conv_backward_weight(x, dy, tuple(w.shape), **geo),
        ),
    }


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no new layer after this")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to benchmark")
        return 1
    if not torch.backends.mps.is_available():
        print("no MPS device (torch.backends.mps.is_available() is False): nothing to benchmark; run this on a Mac")
        return 1
    import flux_dnn

    warmup, reps = (2, 5) if args.quick else (3, 15)
    timer = synced(torch.mps.synchronize)  # wall clock around the call and the wait for its work
    print(
        f"torch {torch.__version__} on MPS, flux_dnn {flux_dnn.__version__}; synchronised wall-clock, "
        "interleaved calls, median"
    )
    print(f"{'layer':24} {'N':>3} {'dtype':8} {'op':10} {'torch ms':>9} {'flux ms':>9} {'ratio':>6}")
    rows = []
    started = time.perf_counter()
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for batch in (int(b) for b in args.batches.split(",")):
            for layer in LAYERS:
                if time.perf_counter() - started > args.budget_s:
                    print(f"time budget spent: skipping {layer.name} N={batch} {dtype_name}")
                    continue
                calls = make_calls(torch, flux_dnn, layer, batch, dtype)
                for op in OPS:
                    torch_fn, flux_fn = calls[op]
                    head = f"{layer.name:24} {batch:3d} {dtype_name:8} {op:10}"
                    try:  # interleaved (torch, flux, flux, torch, ...), reps synchronised calls each
                        t = interleaved({"torch": torch_fn, "flux": flux_fn}, 0.0, reps, reps, warmup, timer=timer)
                        t_ms, f_ms = t["torch"], t["flux"]
                    except Exception as exc:  # report and go on: one failure must not hide the rest
                        print(f"{head} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                        rows.append(dict(layer=layer.name, batch=batch, dtype=dtype_name, op=op, error=str(exc)))
                        write_json(args.json, dict(rows=rows))
                        continue
                    rows.append(
                        dict(
                            layer=layer.name,
                            batch=batch,
                            dtype=dtype_name,
                            op=op,
                            torch_ms=t_ms,
                            flux_ms=f_ms,
                            ratio=t_ms / f_ms,
                        )
                    )
                    print(f"{head} {t_ms:9.3f} {f_ms:9.3f} {t_ms / f_ms:6.2f}")
                    write_json(args.json, dict(rows=rows))  # a run stopped halfway keeps its rows
                del calls
                torch.mps.empty_cache()
    write_json(args.json, dict(rows=rows))
    print_summary(rows)
    measured = sum("ratio" in r for r in rows)
    if not measured:
        print("nothing was measured" + (f": all {len(rows)} measurements failed" if rows else ""))
    return 0 if measured else 1


def print_summary(rows) -> None:
    ok = [r for r in rows if "ratio" in r]
    print("\nsummary: ratio = torch_time / flux_time (aim: geomean >= 1.0)")
    print(f"{'group':14} {'n':>3} {'geomean':>8} {'min':>6} {'max':>6}")
    groups = [("all", ok)]
    groups += [(d, [r for r in ok if r["dtype"] == d]) for d in sorted({r["dtype"] for r in ok})]
    groups += [(f"N={b}", [r for r in ok if r["batch"] == b]) for b in sorted({r["batch"] for r in ok})]
    groups += [(o, [r for r in ok if r["op"] == o]) for o in OPS]
    for name, rs in groups:
        if rs:
            ratios = [r["ratio"] for r in rs]
            print(f"{name:14} {len(rs):3d} {geomean(ratios):8.3f} {min(ratios):6.2f} {max(ratios):6.2f}")
    failed = len(rows) - len(ok)
    if failed:
        print(f"failed measurements: {failed}")


if __name__ == "__main__":
    sys.exit(main())

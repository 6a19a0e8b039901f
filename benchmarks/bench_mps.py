"""flux_dnn's MPS shim against PyTorch's own MPS convolutions, on one Apple GPU.

The ResNet-50 convolution layers at N=1 and N=16, float32 and float16, NCHW, forward,
backward-data and backward-weight: flux_dnn on torch MPS tensors vs
torch.nn.functional.conv2d / torch.nn.grad.conv2d_input / conv2d_weight on the same tensors,
in the same process. Timing is synchronised: each call is followed by torch.mps.synchronize()
(flux_dnn's MPS shim has finished its command buffer when it returns; torch has only queued
its work), wall-clock per call, median of the repetitions; ratio = torch_time / flux_time
(> 1: flux_dnn faster). Aim on an M-series Mac: geometric mean >= 1.0.

Needs a Mac with MPS (torch.backends.mps.is_available()); elsewhere it says so and exits 0.
It has not been run yet: no Mac was available where the shim was written.

    python benchmarks/bench_mps.py [--quick] [--batches 1,16] [--dtypes float32,float16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

# The distinct convolutions of ResNet-50 (torchvision, stride on the 3x3):
# (name, C, K, H=W of the input, kernel, stride, padding).
LAYERS = [
    ("conv1 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
    ("l1 1x1 64->64 @56", 64, 64, 56, 1, 1, 0),
    ("l1 3x3 64 @56", 64, 64, 56, 3, 1, 1),
    ("l1 1x1 64->256 @56", 64, 256, 56, 1, 1, 0),
    ("l1 1x1 256->64 @56", 256, 64, 56, 1, 1, 0),
    ("l2 1x1 256->128 @56", 256, 128, 56, 1, 1, 0),
    ("l2 3x3/2 128 @56", 128, 128, 56, 3, 2, 1),
    ("l2 1x1/2 256->512 @56", 256, 512, 56, 1, 2, 0),
    ("l2 3x3 128 @28", 128, 128, 28, 3, 1, 1),
    ("l2 1x1 128->512 @28", 128, 512, 28, 1, 1, 0),
    ("l3 3x3/2 256 @28", 256, 256, 28, 3, 2, 1),
    ("l3 3x3 256 @14", 256, 256, 14, 3, 1, 1),
    ("l3 1x1 1024->256 @14", 1024, 256, 14, 1, 1, 0),
    ("l3 1x1 256->1024 @14", 256, 1024, 14, 1, 1, 0),
    ("l4 3x3/2 512 @14", 512, 512, 14, 3, 2, 1),
    ("l4 3x3 512 @7", 512, 512, 7, 3, 1, 1),
    ("l4 1x1 2048->512 @7", 2048, 512, 7, 1, 1, 0),
    ("l4 1x1 512->2048 @7", 512, 2048, 7, 1, 1, 0),
]
OPS = ("fwd", "bwd_data", "bwd_weight")


def synced_ms(fn, torch, warmup: int, reps: int) -> float:
    """Median wall-clock milliseconds of fn() followed by torch.mps.synchronize()."""
    for _ in range(warmup):
        fn()
        torch.mps.synchronize()
    times = []
    for _ in range(reps):
        torch.mps.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.mps.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def make_calls(torch, flux_dnn, layer, batch, dtype):
    _, C, K, HW, k, stride, pad = layer
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
        return 0
    if not torch.backends.mps.is_available():
        print("no MPS device (torch.backends.mps.is_available() is False): nothing to benchmark; run this on a Mac")
        return 0
    import flux_dnn

    warmup, reps = (2, 5) if args.quick else (3, 15)
    print(f"torch {torch.__version__} on MPS, flux_dnn {flux_dnn.__version__}; synchronised wall-clock, median")
    print(f"{'layer':24} {'N':>3} {'dtype':8} {'op':10} {'torch ms':>9} {'flux ms':>9} {'ratio':>6}")
    rows = []
    started = time.perf_counter()
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for batch in (int(b) for b in args.batches.split(",")):
            for layer in LAYERS:
                if time.perf_counter() - started > args.budget_s:
                    print(f"time budget spent: skipping {layer[0]} N={batch} {dtype_name}")
                    continue
                calls = make_calls(torch, flux_dnn, layer, batch, dtype)
                for op in OPS:
                    torch_fn, flux_fn = calls[op]
                    head = f"{layer[0]:24} {batch:3d} {dtype_name:8} {op:10}"
                    try:
                        t_ms = synced_ms(torch_fn, torch, warmup, reps)
                        f_ms = synced_ms(flux_fn, torch, warmup, reps)
                    except Exception as exc:  # report and go on: one failure must not hide the rest
                        print(f"{head} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                        rows.append(dict(layer=layer[0], batch=batch, dtype=dtype_name, op=op, error=str(exc)))
                        continue
                    rows.append(
                        dict(
                            layer=layer[0],
                            batch=batch,
                            dtype=dtype_name,
                            op=op,
                            torch_ms=t_ms,
                            flux_ms=f_ms,
                            ratio=t_ms / f_ms,
                        )
                    )
                    print(f"{head} {t_ms:9.3f} {f_ms:9.3f} {t_ms / f_ms:6.2f}")
                del calls
                torch.mps.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    print_summary(rows)
    return 0


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

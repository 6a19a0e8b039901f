"""flux_dnn's cuDNN shim against PyTorch's own cuDNN convolutions, on one NVIDIA GPU.

ResNet-50-like layers at N=32, float32/float16/bfloat16, NCHW and channels-last, forward,
forward with bias + ReLU (flux_dnn's fused graph or conv + its epilogue kernel, whichever
its benchmark found faster, against torch's conv2d with bias then relu_; the table says
which flux_dnn ran), backward-data and backward-weight; flux_dnn on torch CUDA tensors vs
torch.nn.functional.conv2d / torch.nn.grad.conv2d_input / conv2d_weight, with
torch.backends.cudnn.benchmark and flux_dnn's algorithm="benchmark" set the same way, TF32
as each library's default (both allow it for cuDNN convolutions). Timed with CUDA events in
the same process, the two libraries' calls interleaved (flux_dnn._bench.interleaved, the loop
of every flux_dnn benchmark), median of the repetitions; ratio = torch_time / flux_time (> 1:
flux_dnn faster). Also the host overhead per call on a tiny convolution. The JSON file is
rewritten whole after every row and on SIGINT, so a run stopped at its limit keeps its rows.

    python benchmarks/bench_cuda.py [--quick] [--heuristic] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time

from flux_dnn._bench import RESNET50_SAMPLE as LAYERS
from flux_dnn._bench import cuda_events, interleaved, write_json

BATCH = 32
OPS = ("fwd", "fwd_bias_relu", "bwd_data", "bwd_weight")


def make_calls(torch, flux_dnn, layer, dtype, channels_last, algorithm):
    C, K, HW, k, stride, pad, groups = layer.C, layer.K, layer.H, layer.R, layer.stride, layer.pad, layer.groups
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    dev = "cuda"
    x = torch.randn(BATCH, C, HW, HW, device=dev, dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(K, C // groups, k, k, device=dev, dtype=dtype) * 0.05).contiguous(memory_format=fmt)
    b = torch.randn(K, device=dev, dtype=dtype)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad, groups=groups)
    dy = torch.randn_like(y).contiguous(memory_format=fmt)
    geo = dict(stride=stride, padding=pad, groups=groups)
    fx = dict(geo, algorithm=algorithm)
    fused_plan = flux_dnn.conv_plan(x, w, b, activation="relu", **fx)
    return {
        "fwd": (lambda: torch.nn.functional.conv2d(x, w, **geo), lambda: flux_dnn.conv2d(x, w, **fx)),
        "fwd_bias_relu": (
            lambda: torch.relu_(torch.nn.functional.conv2d(x, w, b, **geo)),
            lambda: fused_plan(x),
            "fused" in fused_plan.algorithm,
        ),
        "bwd_data": (
            lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **geo),
            lambda: flux_dnn.conv_backward_data(dy, w, tuple(x.shape), **fx),
        ),
        "bwd_weight": (
            lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **geo),
            lambda: flux_dnn.conv_backward_weight(x, dy, tuple(w.shape), **fx),
        ),
    }


def host_overhead_us(torch, flux_dnn, calls: int) -> tuple:
    """Microseconds of host time per call of a tiny conv (the GPU is never the bottleneck)."""
    x = torch.randn(1, 4, 8, 8, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    result = {}
    for name, fn in (
        ("torch", lambda: torch.nn.functional.conv2d(x, w, padding=1)),
        ("flux_dnn", lambda: flux_dnn.conv2d(x, w, padding=1)),
    ):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        result[name] = (t1 - t0) / calls * 1e6
    return result["torch"], result["flux_dnn"]


def plan_seconds(torch, flux_dnn) -> dict:
    """What runtime-compiled (NVRTC) engines cost, and what cuDNN's kernel cache saves: a
    fused NHWC float16 conv + bias + ReLU planned the first time, its first call from another
    thread (an execution plan for that thread's handle), and the same problem planned again
    (another flux_dnn plan: another workspace limit). Seconds, each including its first call."""
    import threading

    x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) * 0.05).contiguous(
        memory_format=torch.channels_last
    )
    b = torch.randn(64, device="cuda", dtype=torch.float16)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    result = {}
    holder = {}

    def first():
        holder["plan"] = flux_dnn.conv_plan(x, w, b, padding=1, activation="relu")
        holder["plan"](x)

    result["first"] = timed(first)
    result["algorithm"] = holder["plan"].algorithm
    other = {}
    thread = threading.Thread(target=lambda: other.setdefault("s", timed(lambda: holder["plan"](x))))
    thread.start()
    thread.join()
    result["other_thread"] = other["s"]
    result["again"] = timed(
        lambda: flux_dnn.conv_plan(x, w, b, padding=1, activation="relu", workspace_limit=1 << 30)(x)
    )
    return result


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--heuristic",
        action="store_true",
        help="cudnn.benchmark=False and algorithm='heuristic' (default: benchmark on both)",
    )
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        help="start no new layer after this many seconds (the summary still prints); "
        "--quick measures every dtype and layout on two layers first",
    )
    args = parser.parse_args(argv)

    import torch

    import flux_dnn

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    torch.backends.cudnn.benchmark = not args.heuristic
    algorithm = "heuristic" if args.heuristic else "benchmark"
    warmup, reps = (2, 5) if args.quick else (3, 15)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__} (cuDNN "
        f"{torch.backends.cudnn.version()}), flux_dnn {flux_dnn.__version__}, N={BATCH}, "
        f"{'heuristic' if args.heuristic else 'benchmark'} mode on both",
        flush=True,
    )
    results = dict(rows=[], host_us={}, plan_s={})
    save = functools.partial(write_json, args.json, results)  # whole file, renamed into place
    # The plan-time figures first (small, and the first runtime compile of the process).
    try:
        results["plan_s"] = plan_seconds(torch, flux_dnn)
    except Exception as exc:  # report it with the rest
        results["plan_s"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"plan seconds (NHWC float16 conv+bias+ReLU): {results['plan_s']}", flush=True)
    t_us, f_us = host_overhead_us(torch, flux_dnn, 2000 if args.quick else 10000)
    results["host_us"] = dict(torch=t_us, flux_dnn=f_us)
    save()
    print(f"{'layer':24} {'dtype':9} {'layout':6} {'op':10} {'torch ms':>9} {'flux ms':>9} {'ratio':>6}", flush=True)
    started = time.perf_counter()
    try:
        for layer, dtype_name, channels_last in cases(args.dtypes.split(","), args.quick):
            if time.perf_counter() - started > args.budget_s:
                print(f"time budget spent: skipping {layer.name} {dtype_name} {layout(channels_last)}")
                continue
            for row in measure_layer(torch, flux_dnn, layer, dtype_name, channels_last, algorithm, warmup, reps):
                results["rows"].append(row)
                save()  # a run killed at its limit keeps every row measured so far
    except KeyboardInterrupt:  # the GPU check's step limit (SIGINT): keep what was measured
        print("interrupted: the rows so far are written")
    save()
    print_summary(results["rows"], t_us, f_us)
    return 0


def layout(channels_last: bool) -> str:
    return "NHWC" if channels_last else "NCHW"


def cases(dtypes, quick: bool):
    """(layer, dtype, channels_last) in the order they are measured. Quick runs cover every
    dtype and layout on two layers first, then the remaining layers, so a budget cut at any
    point still leaves rows of every (dtype, layout)."""
    combos = [(d, cl) for d in dtypes for cl in (False, True)]
    if not quick:
        return [(layer, d, cl) for d, cl in combos for layer in LAYERS]
    first = [LAYERS[2], LAYERS[5]]  # a 3x3 and a 1x1 layer
    rest = [layer for layer in LAYERS if layer not in first]
    return [(layer, d, cl) for layer in first for d, cl in combos] + [
        (layer, d, cl) for layer in rest for d, cl in combos
    ]


def measure_layer(torch, flux_dnn, layer, dtype_name, channels_last, algorithm, warmup, reps):
    """The rows of one layer (each op; an error row for what failed), printed as measured."""
    base = dict(layer=layer.name, dtype=dtype_name, channels_last=channels_last)
    try:
        calls = make_calls(torch, flux_dnn, layer, getattr(torch, dtype_name), channels_last, algorithm)
    except Exception as exc:  # (a refused plan): report and go on
        print(f"{layer.name:24} {dtype_name:9} setup FAILED: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        return [dict(base, error=str(exc))]
    rows = []
    for op in OPS:
        torch_fn, flux_fn, *fused = calls[op]
        head = f"{layer.name:24} {dtype_name:9} {layout(channels_last):6} {op:10}"
        try:  # interleaved (torch, flux, flux, torch, ...), reps timed calls each, CUDA events
            t = interleaved({"torch": torch_fn, "flux": flux_fn}, 0.0, reps, reps, warmup, timer=cuda_events(torch))
            t_ms, f_ms = t["torch"], t["flux"]
        except Exception as exc:  # report and go on: one failure must not hide the rest
            print(f"{head} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
            rows.append(dict(base, op=op, error=str(exc)))
            continue
        rows.append(
            dict(base, op=op, torch_ms=t_ms, flux_ms=f_ms, ratio=t_ms / f_ms, **({"fused": fused[0]} if fused else {}))
        )
        kind = (" fused" if fused[0] else " unfused") if fused else ""
        print(f"{head} {t_ms:9.3f} {f_ms:9.3f} {t_ms / f_ms:6.2f}{kind}", flush=True)
    del calls
    torch.cuda.empty_cache()
    return rows


def print_summary(rows, t_us, f_us) -> None:
    ok = [r for r in rows if "ratio" in r]
    failed = len(rows) - len(ok)
    print("\nsummary: ratio = torch_time / flux_time (aim: geomean >= 1.0, none below 0.95)")
    print(f"{'group':22} {'n':>3} {'geomean':>8} {'min':>6} {'below 0.95':>10}")
    groups = [("all", ok)]
    groups += [(d, [r for r in ok if r["dtype"] == d]) for d in sorted({r["dtype"] for r in ok})]
    groups += [(o, [r for r in ok if r["op"] == o]) for o in OPS]
    groups += [("NHWC" if cl else "NCHW", [r for r in ok if r["channels_last"] == cl]) for cl in (False, True)]
    for name, rs in groups:
        if rs:
            ratios = [r["ratio"] for r in rs]
            print(
                f"{name:22} {len(rs):3d} {geomean(ratios):8.3f} {min(ratios):6.2f} {sum(v < 0.95 for v in ratios):10d}"
            )
    epilogue = [r for r in ok if "fused" in r]
    if epilogue:
        n_fused = sum(r["fused"] for r in epilogue)
        print(f"bias+relu forward: {n_fused} fused, {len(epilogue) - n_fused} conv + epilogue kernel")
    print(
        f"host overhead per tiny conv: torch {t_us:.1f} us, flux_dnn {f_us:.1f} us"
        f"{f'  (failed measurements: {failed})' if failed else ''}"
    )


if __name__ == "__main__":
    sys.exit(main())

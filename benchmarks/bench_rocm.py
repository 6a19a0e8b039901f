"""The MIOpen shim against torch.nn.functional.conv2d on an AMD GPU (PyTorch ROCm): the
ResNet-50 layer set at N=32, float32/float16/bfloat16, NCHW and NHWC, forward and both
backwards, torch.backends.cudnn.benchmark (MIOpen's) set alike, synchronised timing, medians,
ratios (torch time / flux_dnn time; > 1 means flux_dnn is faster) and their geomean.
NOT RUN: no AMD GPU was reachable when it was written (see scripts/rocm_check.sh)."""

import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flux_dnn

# (C, K, H, kernel, stride, padding) of ResNet-50's distinct convolutions
LAYERS = [
    (3, 64, 224, 7, 2, 3),
    (64, 64, 56, 1, 1, 0),
    (64, 64, 56, 3, 1, 1),
    (64, 256, 56, 1, 1, 0),
    (256, 64, 56, 1, 1, 0),
    (256, 128, 56, 1, 2, 0),
    (128, 128, 28, 3, 1, 1),
    (128, 512, 28, 1, 1, 0),
    (512, 128, 28, 1, 1, 0),
    (512, 256, 28, 1, 2, 0),
    (256, 256, 14, 3, 1, 1),
    (256, 1024, 14, 1, 1, 0),
    (1024, 256, 14, 1, 1, 0),
    (1024, 512, 14, 1, 2, 0),
    (512, 512, 7, 3, 1, 1),
    (512, 2048, 7, 1, 1, 0),
]


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases(x, w, dy, s, p) -> dict:
    """{op: (torch's call, flux_dnn's call)} for one layer's tensors."""
    kw = {"stride": s, "padding": p}
    return {
        "forward": (lambda: F.conv2d(x, w, **kw), lambda: flux_dnn.conv2d(x, w, **kw, algorithm="benchmark")),
        "backward_data": (
            lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **kw),
            lambda: flux_dnn.conv_backward_data(dy, w, x.shape, **kw, algorithm="benchmark"),
        ),
        "backward_weight": (
            lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **kw),
            lambda: flux_dnn.conv_backward_weight(x, dy, w.shape, **kw, algorithm="benchmark"),
        ),
    }


def main():
    if torch.version.hip is None or not torch.cuda.is_available():
        sys.exit("bench_rocm.py needs PyTorch for ROCm and an AMD GPU")
    torch.backends.cudnn.benchmark = True  # MIOpen's search on ROCm, as flux_dnn's "benchmark"
    ratios = []
    print(f"{'layer':26} {'dtype':9} {'layout':6} {'op':16} {'torch ms':>9} {'flux ms':>9} {'ratio':>6}")
    for C, K, H, k, s, p in LAYERS:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for layout in ("NCHW", "NHWC"):
                fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                x = torch.randn(32, C, H, H, device="cuda", dtype=dtype).to(memory_format=fmt)
                w = torch.randn(K, C, k, k, device="cuda", dtype=dtype).to(memory_format=fmt)
                dy = torch.randn_like(F.conv2d(x, w, stride=s, padding=p))
                for op, (ref, ours) in cases(x, w, dy, s, p).items():
                    t_ref, t_ours = timed(ref), timed(ours)
                    ratios.append(t_ref / t_ours)
                    name = f"C{C} K{K} {H}x{H} k{k} s{s}"
                    dt = str(dtype)[6:]
                    print(
                        f"{name:26} {dt:9} {layout:6} {op:16} {t_ref * 1e3:9.3f} {t_ours * 1e3:9.3f} {ratios[-1]:6.2f}"
                    )
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"geomean ratio (torch / flux_dnn, > 1: flux_dnn faster): {geomean:.3f}")


if __name__ == "__main__":
    main()

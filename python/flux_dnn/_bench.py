"""What every flux_dnn benchmark shares: the layer sets, the interleaved median timer, the
machine's description and the JSON writer.

``python -m flux_dnn bench`` (``_bench_cli``) and the scripts in benchmarks/ (bench_cpu,
bench_cuda, bench_rocm, bench_mps, bench_jax) time with :func:`interleaved` on layers from
:data:`LAYER_SETS`, so that a figure of one is measured as a figure of another. Nothing
here imports torch or JAX: the peers are the callers' business.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from typing import NamedTuple


class Layer(NamedTuple):
    """A square 2-D convolution: x (N, C, H, H), w (K, C/groups, R, R)."""

    name: str
    C: int
    H: int
    K: int
    R: int
    stride: int
    pad: int
    groups: int = 1


def out_size(h: int, r: int, s: int, p: int) -> int:
    return (h + 2 * p - r) // s + 1


#: A sample of ResNet-50's layers (a 3x3 and a 1x1 per stage, the stem, and a depthwise 3x3
#: as in ResNeXt-like blocks): what bench_cpu, bench_cuda and bench_jax time.
RESNET50_SAMPLE = [
    Layer("stem 7x7/2 3->64 @224", 3, 224, 64, 7, 2, 3),
    Layer("3x3 64 @56", 64, 56, 64, 3, 1, 1),
    Layer("3x3 128 @28", 128, 28, 128, 3, 1, 1),
    Layer("3x3 256 @14", 256, 14, 256, 3, 1, 1),
    Layer("3x3 512 @7", 512, 7, 512, 3, 1, 1),
    Layer("1x1 256->64 @56", 256, 56, 64, 1, 1, 0),
    Layer("dw 3x3 256 @28 g256", 256, 28, 256, 3, 1, 1, 256),
]

#: The distinct convolutions of ResNet-50 (torchvision, the stride on the 3x3).
RESNET50 = [
    Layer("conv1 7x7/2 3->64 @224", 3, 224, 64, 7, 2, 3),
    Layer("l1 1x1 64->64 @56", 64, 56, 64, 1, 1, 0),
    Layer("l1 3x3 64 @56", 64, 56, 64, 3, 1, 1),
    Layer("l1 1x1 64->256 @56", 64, 56, 256, 1, 1, 0),
    Layer("l1 1x1 256->64 @56", 256, 56, 64, 1, 1, 0),
    Layer("l2 1x1 256->128 @56", 256, 56, 128, 1, 1, 0),
    Layer("l2 3x3/2 128 @56", 128, 56, 128, 3, 2, 1),
    Layer("l2 1x1/2 256->512 @56", 256, 56, 512, 1, 2, 0),
    Layer("l2 3x3 128 @28", 128, 28, 128, 3, 1, 1),
    Layer("l2 1x1 128->512 @28", 128, 28, 512, 1, 1, 0),
    Layer("l3 3x3/2 256 @28", 256, 28, 256, 3, 2, 1),
    Layer("l3 3x3 256 @14", 256, 14, 256, 3, 1, 1),
    Layer("l3 1x1 1024->256 @14", 1024, 14, 256, 1, 1, 0),
    Layer("l3 1x1 256->1024 @14", 256, 14, 1024, 1, 1, 0),
    Layer("l4 3x3/2 512 @14", 512, 14, 512, 3, 2, 1),
    Layer("l4 3x3 512 @7", 512, 7, 512, 3, 1, 1),
    Layer("l4 1x1 2048->512 @7", 2048, 7, 512, 1, 1, 0),
    Layer("l4 1x1 512->2048 @7", 512, 7, 2048, 1, 1, 0),
]

#: MobileNetV2's convolutions at 224x224, one of each kind per resolution: the stem,
#: depthwise 3x3 (stride 1 and 2) and the pointwise expansions and projections.
MOBILENET = [
    Layer("stem 3x3/2 3->32 @224", 3, 224, 32, 3, 2, 1),
    Layer("dw 3x3 32 @112", 32, 112, 32, 3, 1, 1, 32),
    Layer("1x1 32->16 @112", 32, 112, 16, 1, 1, 0),
    Layer("1x1 16->96 @112", 16, 112, 96, 1, 1, 0),
    Layer("dw 3x3/2 96 @112", 96, 112, 96, 3, 2, 1, 96),
    Layer("1x1 24->144 @56", 24, 56, 144, 1, 1, 0),
    Layer("dw 3x3 144 @56", 144, 56, 144, 3, 1, 1, 144),
    Layer("1x1 144->24 @56", 144, 56, 24, 1, 1, 0),
    Layer("dw 3x3 192 @28", 192, 28, 192, 3, 1, 1, 192),
    Layer("1x1 192->32 @28", 192, 28, 32, 1, 1, 0),
    Layer("dw 3x3 384 @14", 384, 14, 384, 3, 1, 1, 384),
    Layer("1x1 384->96 @14", 384, 14, 96, 1, 1, 0),
    Layer("dw 3x3 960 @7", 960, 7, 960, 3, 1, 1, 960),
    Layer("1x1 960->160 @7", 960, 7, 160, 1, 1, 0),
    Layer("1x1 320->1280 @7", 320, 7, 1280, 1, 1, 0),
]

LAYER_SETS = {"resnet50": RESNET50, "resnet50-sample": RESNET50_SAMPLE, "mobilenet": MOBILENET}

#: The layers a quick run takes of each set: a 3x3 (or the depthwise), a 1x1, and a third
#: of another kind, small enough for a busy 2-core machine.
QUICK = {
    "resnet50": ("l2 3x3 128 @28", "l3 1x1 1024->256 @14", "l4 3x3 512 @7"),
    "resnet50-sample": ("3x3 128 @28", "1x1 256->64 @56", "dw 3x3 256 @28 g256"),
    "mobilenet": ("dw 3x3 144 @56", "1x1 144->24 @56", "1x1 384->96 @14"),
}

_SHAPE_KEYS = ("c", "h", "k", "r", "stride", "pad", "groups")


def parse_shape(text: str) -> Layer:
    """A layer from ``c=64,h=56,k=64,r=3[,stride=1][,pad=R//2][,groups=1]`` (--shape)."""
    fields = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _SHAPE_KEYS:
            raise ValueError(f"--shape: {part!r} in {text!r} is not KEY=VALUE with KEY one of {', '.join(_SHAPE_KEYS)}")
        try:
            fields[key] = int(value)
        except ValueError:
            raise ValueError(f"--shape: {key}={value!r} in {text!r} is not an integer") from None
    missing = [k for k in _SHAPE_KEYS[:4] if k not in fields]
    if missing:
        raise ValueError(f"--shape: {text!r} lacks {', '.join(missing)} (c, h, k and r are required)")
    c, h, k, r = (fields[key] for key in _SHAPE_KEYS[:4])
    stride, pad, groups = fields.get("stride", 1), fields.get("pad", r // 2), fields.get("groups", 1)
    if min(c, h, k, r, stride, groups) < 1 or pad < 0 or c % groups or k % groups:
        raise ValueError(
            f"--shape: {text!r} is not a convolution (c, h, k, r, stride, groups >= 1, pad >= 0, "
            "groups dividing c and k)"
        )
    if out_size(h, r, stride, pad) < 1:
        raise ValueError(f"--shape: {text!r} leaves no output (h + 2 pad < r)")
    name = f"{r}x{r}{f'/{stride}' if stride > 1 else ''} {c}->{k} @{h}{f' g{groups}' if groups > 1 else ''}"
    return Layer(name, c, h, k, r, stride, pad, groups)


# ------------------------------------------------------------------------------------------
# Timing


def time_once(fn) -> float:
    """Milliseconds of one call, by the wall clock (the CPU's timer)."""
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) * 1e-6


def synced(sync):
    """A timer for work queued on a device: one call then sync(), by the wall clock (the MPS
    and ROCm benchmarks: a call returns before its device work has run)."""

    def timer(fn) -> float:
        t0 = time.perf_counter_ns()
        fn()
        sync()
        return (time.perf_counter_ns() - t0) * 1e-6

    return timer


def cuda_events(torch):
    """A timer by CUDA events around one call, on torch's current stream (CUDA and ROCm
    builds of torch): the device's time from the first to the last of the call's work."""

    def timer(fn) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    return timer


def interleaved(
    fns: dict,
    budget_s: float,
    min_reps: int,
    max_reps: int,
    warmup: int = 3,
    own_reps: bool = False,
    first_ms: dict | None = None,
    timer=time_once,
) -> dict:
    """Median ms of each callable, timed A, B, A, B, ... (the order rotates every round), so
    that the load of a shared machine hits every callable alike.

    own_reps=False: every callable gets the same number of calls (budget / one round).
    own_reps=True: each callable gets its own count, (budget / number of callables) / its
    time, clamped to [min_reps, max_reps], and a slow one's calls are spread evenly over the
    rounds (so a 2 s torch float16 call and a 5 ms flux call are still interleaved, and the
    fast one is not held to the slow one's few samples). first_ms: the time of a call already
    made (the check), which counts as a warm-up call; a callable slower than half the budget
    gets no further warm-up. timer(fn) -> ms times one call (time_once, synced(...), or CUDA
    events). Also returns "_min NAME", "_reps NAME" and "_reps" (the rounds)."""
    names = list(fns)
    want = (_own_reps if own_reps else _same_reps)(
        fns, budget_s * 1e3, min_reps, max_reps, warmup, first_ms or {}, timer
    )
    rounds = max(want.values())
    samples = {n: [] for n in names}
    for i in range(rounds):
        due = [n for n in names if (i + 1) * want[n] // rounds > i * want[n] // rounds]
        k = i % len(due) if due else 0
        for n in due[k:] + due[:k]:
            samples[n].append(timer(fns[n]))
    return (
        {n: statistics.median(v) for n, v in samples.items()}
        | {f"_min {n}": min(v) for n, v in samples.items()}
        | {f"_reps {n}": len(v) for n, v in samples.items()}
        | {"_reps": rounds}
    )


def _same_reps(fns, budget_ms, min_reps, max_reps, warmup, first_ms, timer) -> dict:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    probe = sum(timer(fn) for fn in fns.values())  # ms for one round
    reps = int(min(max_reps, max(min_reps, budget_ms / max(probe, 1e-3))))
    return {n: reps for n in fns}


def _own_reps(fns, budget_ms, min_reps, max_reps, warmup, first_ms, timer) -> dict:
    want = {}
    for n, fn in fns.items():
        t, calls, spent = first_ms.get(n), (1 if n in first_ms else 0), first_ms.get(n, 0.0)
        while calls < warmup + 1:  # the last warm-up call is the probe
            if calls >= 1 and t > 0.5 * budget_ms:
                break
            if calls >= 2 and spent > 0.25 * budget_ms:
                break
            t = timer(fn)
            spent += t
            calls += 1
        want[n] = int(min(max_reps, max(min_reps, budget_ms / len(fns) / max(t, 1e-3))))
    return want


def geomean(values) -> float:
    """The geometric mean of the positive finite values (nan when there is none)."""
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


# ------------------------------------------------------------------------------------------
# The machine

#: ISA flags of /proc/cpuinfo that matter to convolution kernels
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni")
#: and their counterparts on Arm (the "Features" line)
ARM_FLAGS = ("asimd", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2", "sme")


def cpu_info() -> dict:
    """Model name, logical CPU count and the convolution-relevant ISA flags of /proc/cpuinfo
    (flags_read False where there is none: macOS, Windows)."""
    model, have = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and have is None:
                    have = set(value.split())
    except OSError:
        pass
    known = ARM_FLAGS if platform.machine().lower() in ("aarch64", "arm64") else ISA_FLAGS
    return dict(
        model=model or platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        isa_present=[x for x in known if have and x in have],
        isa_absent=[x for x in known if have is not None and x not in have],
        flags_read=have is not None,
    )


def cpu_text() -> str:
    """One line: the CPU model, its count and the ISA flags present and absent."""
    c = cpu_info()
    if not c["flags_read"]:
        return f"{c['model']}, {c['cpus']} CPUs (ISA flags not readable here)"
    present, absent = " ".join(c["isa_present"]) or "none", " ".join(c["isa_absent"]) or "none"
    return f"{c['model']}, {c['cpus']} CPUs, ISA {present} (absent: {absent})"


def load_text() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # Windows
        return "?"


def write_json(path: str | None, data) -> None:
    """Writes data to path whole (written aside, then renamed), so a run killed while it
    writes never leaves half a file; nothing when path is None."""
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)

#!/usr/bin/env python
"""flux_dnn vs PyTorch on the CPU: ResNet-50-like convolution layers, same process.

Both libraries get the same torch tensors (flux_dnn takes them zero-copy through DLPack;
``--numpy`` adds a column for flux_dnn on NumPy views of the same memory). Calls are
interleaved (flux, torch, flux, torch, ...) so that the load of a shared machine hits both
alike, and every number is a median over many calls (flux_dnn._bench.interleaved: the loop
of every flux_dnn benchmark and of ``python -m flux_dnn bench``, which times the common case
in one command). The ratio is torch_time / flux_time:
above 1.0 means flux_dnn is faster.

The peers:
  forward          torch.nn.functional.conv2d
  forward_plan     the same, with flux_dnn.conv_plan (weights packed once, no per-call checks)
  backward_data    torch.ops.aten.convolution_backward, output_mask (True, False, False)
  backward_weight  torch.ops.aten.convolution_backward, output_mask (False, True, False)
                   (what autograd calls; torch.nn.grad.conv2d_* are thin wrappers over it)
  transpose        torch.nn.functional.conv_transpose2d
Ops that flux_dnn does not have yet are skipped with a note.

Dtypes: float32, bfloat16, float16, float64 (torch tensors of that dtype for both libraries;
torch's float16 CPU convolution is its slow path, which is the point of that comparison).
Each row says which flux_dnn shim served it (the first CPU shim, in flux_dnn's order, that
computes the dtype; ``--shims blas`` sets FLUX_DNN_SHIMS before flux_dnn is imported and so
forces one). For 16-bit rows flux_dnn is also timed in float32 on the same problem,
interleaved with the other two: "vs own f32" = flux float32 time / flux 16-bit time (1.0: the
16-bit call costs what the float32 call costs). The summary gives, per (dtype, shim), the
geometric mean and minimum of torch/flux and how many rows are below 1.0.

This is a benchmark, not a test: it asserts nothing about time.

    python benchmarks/bench_cpu.py                      # fp32 forward, N=1,16, NCHW+NHWC
    python benchmarks/bench_cpu.py --quick --markdown
    python benchmarks/bench_cpu.py --ops forward,backward_data,backward_weight,transpose \\
        --dtypes float32,bfloat16 --batch 16 --markdown
    OMP_NUM_THREADS=1 python benchmarks/bench_cpu.py --ops forward,backward_data,backward_weight \\
        --dtypes float16 --no-tiny --budget 0.5 --min-reps 3 --markdown --json f16.json
    OMP_NUM_THREADS=1 python benchmarks/bench_cpu.py --shims blas --dtypes float32 ...   # BLAS shim only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def _shims_from_argv(argv) -> str | None:
    """The value of --shims in argv (``--shims a,b`` or ``--shims=a,b``), or None."""
    for i, a in enumerate(argv):
        if a == "--shims" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--shims="):
            return a.split("=", 1)[1]
    return None


if __name__ == "__main__" and _shims_from_argv(sys.argv[1:]) is not None:
    # Before flux_dnn is imported: the shim registry reads FLUX_DNN_SHIMS once.
    os.environ["FLUX_DNN_SHIMS"] = _shims_from_argv(sys.argv[1:])

import flux_dnn  # noqa: E402

# The layers, the timer and the machine's description are flux_dnn's own (flux_dnn._bench,
# shared with python -m flux_dnn bench and the other benchmarks); re-exported here for the
# scripts that import them from bench_cpu (policies.py, bench_blas_threads.py).
from flux_dnn._bench import ISA_FLAGS, Layer, cpu_info, geomean, interleaved, out_size  # noqa: E402, F401
from flux_dnn._bench import RESNET50_SAMPLE as LAYERS  # noqa: E402
from flux_dnn._bench import time_once as _time_once  # noqa: E402

OPS = ("forward", "forward_plan", "backward_data", "backward_weight", "transpose")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
SIXTEEN = ("float16", "bfloat16")


# ------------------------------------------------------------------------------------------
# Cases: what each library is asked to compute, on the same tensors


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t.contiguous()


def _np_view(t: torch.Tensor):
    """A NumPy view of a float32 torch tensor's memory (strides kept); None for bf16."""
    if t.dtype != torch.float32:
        return None
    return t.detach().numpy()


def make_case(op: str, layer: Layer, n: int, dtype, layout: str, gen: torch.Generator, fkw: dict):
    """(flux_fn, torch_fn, flux_numpy_fn or None, check_fn) for one configuration, or a str
    saying why it is skipped."""
    L = layer
    Ho = out_size(L.H, L.R, L.stride, L.pad)
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    w = _layout(rnd(L.K, L.C // L.groups, L.R, L.R) * 0.1, layout)
    s, p, g = L.stride, L.pad, L.groups

    if op == "forward":
        x = _layout(rnd(n, L.C, L.H, L.H), layout)
        xn, wn = _np_view(x), _np_view(w)
        return dict(
            flux=lambda: flux_dnn.conv2d(x, w, None, s, p, 1, g, **fkw),
            torch=lambda: F.conv2d(x, w, None, s, p, 1, g),
            flux_numpy=(lambda: flux_dnn.conv2d(xn, wn, None, s, p, 1, g, **fkw)) if xn is not None else None,
        )

    if op == "forward_plan":
        if not hasattr(flux_dnn, "conv_plan"):
            return "flux_dnn.conv_plan does not exist yet"
        x = _layout(rnd(n, L.C, L.H, L.H), layout)
        plan = flux_dnn.conv_plan(x, w, None, s, p, 1, g, **fkw)
        xn, wn = _np_view(x), _np_view(w)
        plan_np = flux_dnn.conv_plan(xn, wn, None, s, p, 1, g, **fkw) if xn is not None else None
        return dict(
            flux=lambda: plan(x),
            torch=lambda: F.conv2d(x, w, None, s, p, 1, g),
            flux_numpy=(lambda: plan_np(xn)) if plan_np is not None else None,
        )

    if op in ("backward_data", "backward_weight"):
        fname = "conv_backward_data" if op == "backward_data" else "conv_backward_weight"
        if not hasattr(flux_dnn, fname):
            return f"flux_dnn.{fname} does not exist yet"
        x = _layout(rnd(n, L.C, L.H, L.H), layout)
        dy = _layout(rnd(n, L.K, Ho, Ho), layout)
        mask = [op == "backward_data", op == "backward_weight", False]
        aten = torch.ops.aten.convolution_backward
        tfn = lambda: aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, mask)  # noqa: E731
        if op == "backward_data":
            f = flux_dnn.conv_backward_data
            ffn = lambda: f(dy, w, tuple(x.shape), s, p, 1, g)  # noqa: E731
            dyn, wn = _np_view(dy), _np_view(w)
            fnp = (lambda: f(dyn, wn, tuple(x.shape), s, p, 1, g)) if dyn is not None else None
        else:
            f = flux_dnn.conv_backward_weight
            ffn = lambda: f(x, dy, tuple(w.shape), s, p, 1, g)  # noqa: E731
            xn, dyn = _np_view(x), _np_view(dy)
            fnp = (lambda: f(xn, dyn, tuple(w.shape), s, p, 1, g)) if xn is not None else None
        return dict(flux=ffn, torch=tfn, flux_numpy=fnp)

    if op == "transpose":
        if not hasattr(flux_dnn, "conv_transpose2d"):
            return "flux_dnn.conv_transpose2d does not exist yet"
        # The adjoint of the forward layer: (N, K, Ho, Ho) -> (N, C, H, H), weight (K, C/g, R, R).
        xt = _layout(rnd(n, L.K, Ho, Ho), layout)
        op_pad = L.H - ((Ho - 1) * s - 2 * p + (L.R - 1) + 1)
        wt = _layout(rnd(L.K, L.C // g, L.R, L.R) * 0.1, layout)
        f = flux_dnn.conv_transpose2d
        xn, wn = _np_view(xt), _np_view(wt)
        return dict(
            flux=lambda: f(xt, wt, None, s, p, op_pad, g, 1),
            torch=lambda: F.conv_transpose2d(xt, wt, None, s, p, op_pad, g, 1),
            flux_numpy=(lambda: f(xn, wn, None, s, p, op_pad, g, 1)) if xn is not None else None,
        )
    raise ValueError(op)


def check(fns: dict, dtype, first_ms: dict | None = None) -> float:
    """Max relative difference between flux_dnn's and torch's results (sanity, not a test).
    The time of each of these first calls goes into first_ms (a warm-up call for timing)."""
    t0 = time.perf_counter_ns()
    a = fns["flux"]()
    t1 = time.perf_counter_ns()
    b = fns["torch"]()
    t2 = time.perf_counter_ns()
    if first_ms is not None:
        first_ms.update(flux=(t1 - t0) * 1e-6, torch=(t2 - t1) * 1e-6)
    if isinstance(b, tuple):
        b = next(t for t in b if t is not None)
    a = torch.as_tensor(a).double()
    b = b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


# ------------------------------------------------------------------------------------------
# Tiny conv: per-call overhead


def tiny(calls: int, blocks: int = 20) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, 8, generator=gen)
    w = torch.randn(4, 4, 3, 3, generator=gen)
    xn, wn = x.numpy(), w.numpy()
    fns = {
        "flux_numpy": lambda: flux_dnn.conv2d(xn, wn, padding=1),
        "flux_torch": lambda: flux_dnn.conv2d(x, w, padding=1),
        "torch": lambda: F.conv2d(x, w, None, 1, 1),
    }
    if hasattr(flux_dnn, "conv_plan"):
        plan_np, plan_t = flux_dnn.conv_plan(xn, wn, padding=1), flux_dnn.conv_plan(x, w, padding=1)
        fns["plan_numpy"] = lambda: plan_np(xn)
        fns["plan_torch"] = lambda: plan_t(x)
    per_block = max(1, calls // blocks)
    for fn in fns.values():  # warm up: plans, memo, caches
        for _ in range(200):
            fn()
    samples = {n: [] for n in fns}
    names = list(fns)
    for i in range(blocks):
        order = names[i % len(names) :] + names[: i % len(names)]
        for n in order:
            fn = fns[n]
            t0 = time.perf_counter_ns()
            for _ in range(per_block):
                fn()
            samples[n].append((time.perf_counter_ns() - t0) / per_block / 1e3)  # µs per call
    return {n: statistics.median(v) for n, v in samples.items()} | {"calls": per_block * blocks}


# ------------------------------------------------------------------------------------------
# Reporting


def cpu_shims() -> list:
    """The usable CPU shims, in the order flux_dnn asks them, with the device name each shim
    gives (oneDNN: its effective ISA)."""
    out = []
    for s in flux_dnn.shims():
        if s.device_type != 1:
            continue
        device = ""
        try:  # the shim's own device string, e.g. "x86-64 CPU, oneDNN ISA avx2"
            from flux_dnn._discovery import REGISTRY

            entry = next(e for e in REGISTRY.usable_for(1)[0] if e.name == s.name)
            device = entry.device_info(0)["name"]
        except Exception:  # noqa: BLE001 -- private API; the rest still prints
            pass
        out.append(
            dict(
                name=s.name,
                usable=s.usable,
                vendor=f"{s.vendor} {s.vendor_version_runtime}".strip(),
                device=device,
                dtypes=list(s.dtypes),
                dtype_support={d: list(v) for d, v in s.dtype_support.items()},
                reason=s.reason,
            )
        )
    return out


def serving_shim(dtype: str, shims_list: list) -> str:
    """The shim that serves a dtype on CPU arrays: the first usable one that lists it. Checked
    against the registry's own choice where that private API is there."""
    name = next((s["name"] for s in shims_list if s["usable"] and dtype in s["dtypes"]), None)
    try:
        from flux_dnn._discovery import REGISTRY

        real = REGISTRY.shim_for(1, dtype).name
        if name != real:
            return f"{real} (shims() order says {name})"
    except Exception:  # noqa: BLE001
        pass
    return name or "none"


def machine_text() -> str:
    c = cpu_info()
    shims_list = cpu_shims()
    vendors = (
        "; ".join(f"{s['name']}: {s['vendor']}" + (f" ({s['device']})" if s["device"] else "") for s in shims_list)
        or "?"
    )
    import re

    found = re.search(r"MKL-DNN v([0-9.]+)", torch.__config__.show())
    return (
        f"{c['model']}, {c['cpus']} CPUs, ISA flags: {' '.join(c['isa_present']) or '?'}"
        f" (absent: {' '.join(c['isa_absent']) or 'none'}); torch {torch.__version__} "
        f"({torch.get_num_threads()} threads, its own oneDNN {found.group(1) if found else '?'}); "
        f"flux_dnn {flux_dnn.__version__} shims [{vendors}]; Python {platform.python_version()}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"FLUX_DNN_SHIMS={os.environ.get('FLUX_DNN_SHIMS', 'unset')}, "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}"
    )


def print_header(dtypes, shims_list, serving, load) -> None:
    c = cpu_info()
    loads = " ".join(f"{v:.2f}" for v in load[:3])
    print(f"# CPU: {c['model']}, {c['cpus']} logical CPUs, load average at start {loads}")
    if c["flags_read"]:
        present, absent = " ".join(c["isa_present"]) or "none", " ".join(c["isa_absent"]) or "none"
        print(f"# ISA flags present: {present}; absent: {absent}")
    else:
        print("# ISA flags: /proc/cpuinfo not readable")
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads; flux_dnn {flux_dnn.__version__}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
        f"FLUX_DNN_SHIMS={os.environ.get('FLUX_DNN_SHIMS', 'unset')}"
    )
    for s in shims_list:
        state = "usable" if s["usable"] else f"not usable: {s['reason']}"
        print(
            f"# shim {s['name']}: {s['vendor']}" + (f", device {s['device']!r}" if s["device"] else "") + f", {state}"
        )
        for d, (how, detail) in s["dtype_support"].items():
            print(f"#   {d:9s} {how}" + (f": {detail}" if detail else ""))
    print("# served by: " + ", ".join(f"{d} -> {serving[d]}" for d in dtypes), flush=True)


def summaries(rows) -> list:
    """Per (dtype, shim): torch/flux geometric mean, minimum, rows below 1.0; and for 16-bit
    rows, flux float32 / flux 16-bit (geometric mean, minimum, rows below 0.7)."""
    out = []
    done = [r for r in rows if "skip" not in r]
    for dt, shim in dict.fromkeys((r["dtype"], r["shim"]) for r in done):
        sel = [r for r in done if r["dtype"] == dt and r["shim"] == shim]
        ratios = [r["ratio"] for r in sel]
        own = [r["own_f32"] for r in sel if r.get("own_f32")]
        out.append(
            dict(
                dtype=dt,
                shim=shim,
                rows=len(sel),
                geomean=geomean(ratios),
                min=min(ratios),
                below_1=sum(x < 1.0 for x in ratios),
                min_row=min(sel, key=lambda r: r["ratio"])["key"],
                own_f32_geomean=geomean(own) if own else None,
                own_f32_min=min(own) if own else None,
                own_f32_below_0_7=sum(x < 0.7 for x in own) if own else None,
                own_f32_min_row=min((r for r in sel if r.get("own_f32")), key=lambda r: r["own_f32"])["key"]
                if own
                else None,
            )
        )
    return out


def print_summaries(summ) -> None:
    print(
        "| dtype | shim | rows | torch/flux geomean | min (row) | rows < 1.0 "
        "| vs own f32 geomean | min (row) | rows < 0.7 |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|---:|")
    for s in summ:
        own = (
            f"{s['own_f32_geomean']:.2f} | {s['own_f32_min']:.2f} ({s['own_f32_min_row']}) | {s['own_f32_below_0_7']}"
            if s["own_f32_geomean"] is not None
            else "- | - | -"
        )
        print(
            f"| {s['dtype']} | {s['shim']} | {s['rows']} | {s['geomean']:.2f} | {s['min']:.2f} ({s['min_row']}) | "
            f"{s['below_1']} | {own} |"
        )


def print_markdown(rows, tiny_result, with_numpy):
    with_own = any(r.get("own_f32") for r in rows)
    head = "| op | dtype | shim | N | layout | layer | flux ms | torch ms | torch/flux | of minima |"
    sep = "|---|---|---|---:|---|---|---:|---:|---:|---:|"
    if with_own:
        head += " flux f32 ms | vs own f32 |"
        sep += "---:|---:|"
    if with_numpy:
        head += " flux(numpy) ms |"
        sep += "---:|"
    print(head)
    print(sep)
    for r in rows:
        if "skip" in r:
            continue
        line = (
            f"| {r['op']} | {r['dtype']} | {r['shim']} | {r['N']} | {r['layout']} | {r['layer']} | "
            f"{r['flux_ms']:.3f} | {r['torch_ms']:.3f} | {r['ratio']:.2f}{' **<1**' if r['ratio'] < 1.0 else ''} | "
            + (f"{r['ratio_min']:.2f} |" if "ratio_min" in r else "- |")
        )
        if with_own:
            line += (
                f" {r['flux_f32_ms']:.3f} | {r['own_f32']:.2f}{' **<0.7**' if r['own_f32'] < 0.7 else ''} |"
                if r.get("own_f32")
                else " - | - |"
            )
        if with_numpy:
            line += f" {r['flux_numpy_ms']:.3f} |" if r.get("flux_numpy_ms") else " - |"
        print(line)
    print()
    print("Geometric mean of torch/flux:")
    print()
    print("| op | dtype | shim | all | " + " | ".join(f"N={n} {layout}" for n, layout in _groups(rows)) + " |")
    print("|---|---|---|---:|" + "---:|" * len(_groups(rows)))
    for op, dt, shim in dict.fromkeys((r["op"], r["dtype"], r["shim"]) for r in rows if "skip" not in r):
        sel = [r for r in rows if "skip" not in r and r["op"] == op and r["dtype"] == dt and r["shim"] == shim]
        cells = []
        for n, layout in _groups(rows):
            sub = [r["ratio"] for r in sel if r["N"] == n and r["layout"] == layout]
            cells.append(f"{geomean(sub):.2f}" if sub else "-")
        print(f"| {op} | {dt} | {shim} | {geomean([r['ratio'] for r in sel]):.2f} | " + " | ".join(cells) + " |")
    if with_own:
        print()
        print("Geometric mean of vs own f32 (flux float32 ms / flux 16-bit ms):")
        print()
        print("| op | dtype | shim | all | " + " | ".join(f"N={n} {layout}" for n, layout in _groups(rows)) + " |")
        print("|---|---|---|---:|" + "---:|" * len(_groups(rows)))
        for op, dt, shim in dict.fromkeys(
            (r["op"], r["dtype"], r["shim"]) for r in rows if "skip" not in r and r.get("own_f32")
        ):
            sel = [
                r
                for r in rows
                if "skip" not in r and r.get("own_f32") and r["op"] == op and r["dtype"] == dt and r["shim"] == shim
            ]
            cells = []
            for n, layout in _groups(rows):
                sub = [r["own_f32"] for r in sel if r["N"] == n and r["layout"] == layout]
                cells.append(f"{geomean(sub):.2f}" if sub else "-")
            print(f"| {op} | {dt} | {shim} | {geomean([r['own_f32'] for r in sel]):.2f} | " + " | ".join(cells) + " |")
    print()
    print("Summary per (dtype, shim) over all rows:")
    print()
    print_summaries(summaries(rows))
    skipped = dict.fromkeys(r["skip"] for r in rows if "skip" in r)
    for why in skipped:
        print(f"\nSkipped: {why}")
    if tiny_result:
        t = tiny_result
        print()
        print(f"Tiny conv (x 1x4x8x8, w 4x4x3x3, pad 1), median µs per call over {t['calls']} calls each:")
        print()
        cols = [c for c in ("flux_numpy", "flux_torch", "plan_numpy", "plan_torch") if c in t]
        names = {
            "flux_numpy": "conv2d on NumPy",
            "flux_torch": "conv2d on torch",
            "plan_numpy": "conv_plan on NumPy",
            "plan_torch": "conv_plan on torch",
        }
        print("| torch F.conv2d | " + " | ".join(f"flux {names[c]}" for c in cols) + " |")
        print("|---:|" + "---:|" * len(cols))
        print(f"| {t['torch']:.2f} | " + " | ".join(f"{t[c]:.2f} ({t['torch'] / t[c]:.2f}x)" for c in cols) + " |")
        print()
        print("(µs per call; in parentheses torch / flux)")


def _groups(rows):
    return list(dict.fromkeys((r["N"], r["layout"]) for r in rows if "skip" not in r))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run: fewer repetitions, 2000 tiny calls")
    ap.add_argument("--ops", default="forward", help=f"comma list of {','.join(OPS)} (default forward)")
    ap.add_argument(
        "--dtypes",
        default="float32",
        help=f"comma list of {','.join(DTYPES)}; a 16-bit dtype also "
        "times flux_dnn in float32 on the same problem (the 'vs own f32' column)",
    )
    ap.add_argument(
        "--shims",
        default=None,
        help="NAME[,NAME]: set FLUX_DNN_SHIMS (before flux_dnn is imported), "
        "e.g. 'blas' to force the BLAS shim for every dtype",
    )
    ap.add_argument("--batch", default="1,16", help="comma list of batch sizes")
    ap.add_argument("--layouts", default="nchw,nhwc", help="comma list of nchw,nhwc (nhwc: x, w, dy channels-last)")
    ap.add_argument("--layers", default="", help="substring filter on layer names (comma list)")
    ap.add_argument("--numpy", action="store_true", help="also time flux_dnn on NumPy views (float32)")
    ap.add_argument(
        "--algorithm", default="heuristic", help="flux_dnn algorithm: heuristic, benchmark or 0/1/2 (forward only)"
    )
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per layer (default 2, --quick 0.4)")
    ap.add_argument(
        "--min-reps", type=int, default=None, help="fewest timed calls of each callable (default 15, --quick 5)"
    )
    ap.add_argument(
        "--max-reps", type=int, default=None, help="most timed calls of each callable (default 400, --quick 50)"
    )
    ap.add_argument(
        "--tiny-calls", type=int, default=None, help="calls for the tiny conv (default 20000, --quick 2000; 0 skips)"
    )
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny conv")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables at the end")
    ap.add_argument("--json", default=None, help="write raw results to this file")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (oneDNN in flux_dnn follows OMP_NUM_THREADS)"
    )
    args = ap.parse_args(argv)

    if args.shims is not None and os.environ.get("FLUX_DNN_SHIMS") != args.shims:
        # main() called with an argv of its own: flux_dnn is imported, but its registry reads
        # FLUX_DNN_SHIMS lazily, at first use; reset it in case something used it already.
        os.environ["FLUX_DNN_SHIMS"] = args.shims
        from flux_dnn._discovery import REGISTRY

        REGISTRY.reset()

    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            ap.error(f"--ops: unknown op {o!r}; known: {', '.join(OPS)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: unknown dtype {d!r}; known: {', '.join(DTYPES)}")
    batches = [int(b) for b in args.batch.split(",") if b]
    layouts = [name for name in args.layouts.split(",") if name]
    layers = [L for L in LAYERS if not args.layers or any(f in L.name for f in args.layers.split(","))]
    budget = args.budget if args.budget is not None else (0.4 if args.quick else 2.0)
    min_reps, max_reps = (5, 50) if args.quick else (15, 400)
    min_reps = args.min_reps if args.min_reps is not None else min_reps
    max_reps = max(min_reps, args.max_reps if args.max_reps is not None else max_reps)
    tiny_calls = (
        0 if args.no_tiny else (args.tiny_calls if args.tiny_calls is not None else (2000 if args.quick else 20000))
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    algorithm = args.algorithm if args.algorithm in ("heuristic", "benchmark") else int(args.algorithm)
    fkw = {} if algorithm == "heuristic" else {"algorithm": algorithm}

    load_start = os.getloadavg()
    t_start = time.perf_counter()
    shims_list = cpu_shims()
    serving = {
        d: serving_shim(d, shims_list)
        for d in dict.fromkeys(dtypes + (["float32"] if set(dtypes) & set(SIXTEEN) else []))
    }
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}", flush=True)
    print(f"# {machine_text()}", flush=True)
    print_header(list(serving), shims_list, serving, load_start)
    print(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}", flush=True)

    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for op in ops:
            for dt in dtypes:
                for n in batches:
                    for layout in layouts:
                        for L in layers:
                            case = make_case(op, L, n, DTYPES[dt], layout, gen, fkw)
                            base = dict(
                                op=op,
                                dtype=dt,
                                shim=serving[dt],
                                N=n,
                                layout=layout,
                                layer=L.name,
                                key=f"{op} N={n} {layout} {L.name}",
                            )
                            if isinstance(case, str):
                                rows.append(base | {"skip": case})
                                print(f"{op:16s} {dt:9s} N={n:<3d} {layout} {L.name:24s} skipped: {case}", flush=True)
                                break
                            fns = {"flux": case["flux"], "torch": case["torch"]}
                            if args.numpy and case.get("flux_numpy"):
                                fns["flux_numpy"] = case["flux_numpy"]
                            first = {}
                            try:
                                err = check(fns, DTYPES[dt], first)
                                if dt in SIXTEEN:  # flux_dnn in float32 on the same problem, same tensors' shapes
                                    f32 = make_case(
                                        op, L, n, torch.float32, layout, torch.Generator().manual_seed(1), fkw
                                    )
                                    fns["flux_f32"] = f32["flux"]
                                    first["flux_f32"] = _time_once(fns["flux_f32"])
                            except Exception as e:  # noqa: BLE001 -- report and go on
                                rows.append(base | {"skip": f"{op} {dt} {layout}: {type(e).__name__}: {e}"})
                                print(f"{op:16s} {dt:9s} N={n:<3d} {layout} {L.name:24s} error: {e}", flush=True)
                                continue
                            t = interleaved(fns, budget, min_reps, max_reps, own_reps=True, first_ms=first)
                            r = base | dict(
                                flux_ms=t["flux"],
                                torch_ms=t["torch"],
                                ratio=t["torch"] / t["flux"],
                                ratio_min=t["_min torch"] / t["_min flux"],
                                reps=t["_reps"],
                                reps_flux=t["_reps flux"],
                                reps_torch=t["_reps torch"],
                                max_rel_diff=err,
                            )
                            if "flux_numpy" in t:
                                r["flux_numpy_ms"] = t["flux_numpy"]
                            if "flux_f32" in t:
                                r |= dict(
                                    flux_f32_ms=t["flux_f32"],
                                    own_f32=t["flux_f32"] / t["flux"],
                                    own_f32_min=t["_min flux_f32"] / t["_min flux"],
                                    reps_flux_f32=t["_reps flux_f32"],
                                    shim_f32=serving["float32"],
                                )
                            rows.append(r)
                            print(
                                f"{op:16s} {dt:9s} {r['shim']:6s} N={n:<3d} {layout} {L.name:24s} "
                                f"flux {t['flux']:9.3f} ms  torch {t['torch']:9.3f} ms  "
                                f"torch/flux {r['ratio']:6.2f} (of minima {r['ratio_min']:6.2f})"
                                + (
                                    f"  flux f32 {t['flux_f32']:8.3f} ms vs own f32 {r['own_f32']:4.2f}"
                                    if "flux_f32" in t
                                    else ""
                                )
                                + f"  (reps flux {t['_reps flux']} torch {t['_reps torch']}, rel diff {err:.1e})"
                                + (f"  flux(numpy) {t['flux_numpy']:.3f} ms" if "flux_numpy" in t else ""),
                                flush=True,
                            )

    tiny_result = None
    if tiny_calls:
        tiny_result = tiny(tiny_calls)
        print(
            "tiny conv µs/call: " + "  ".join(f"{k} {v:.2f}" for k, v in tiny_result.items() if k != "calls"),
            flush=True,
        )

    load_end = os.getloadavg()
    elapsed = time.perf_counter() - t_start
    print("\nplan cache:", flux_dnn.plan_cache_info())
    print()
    print("Summary per (dtype, shim): torch/flux over all rows; vs own f32 = flux float32 ms / flux 16-bit ms")
    print()
    summ = summaries(rows)
    print_summaries(summ)
    print(
        f"\n# load average at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
        f"(at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}); run took {elapsed:.0f} s",
        flush=True,
    )
    if args.markdown:
        print()
        print_markdown(rows, tiny_result, args.numpy)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    machine=machine_text(),
                    cpu=cpu_info(),
                    torch=torch.__version__,
                    torch_threads=torch.get_num_threads(),
                    shims=shims_list,
                    served_by=serving,
                    loadavg_start=load_start,
                    loadavg_end=load_end,
                    elapsed_s=elapsed,
                    argv=sys.argv,
                    rows=rows,
                    summary=summ,
                    tiny=tiny_result,
                ),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

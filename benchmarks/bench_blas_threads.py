#!/usr/bin/env python
"""The BLAS (OpenBLAS) shim on one thread and on every core, against its peers, same process.

Per layer of the ResNet set (flux_dnn._bench.RESNET50_SAMPLE, as bench_cpu), batch size and
layout (NCHW, or x and w channels-last), each dtype is timed with its peer at 1 thread, then
at --threads (default: every core), the two interleaved call by call (the order rotating every
round) so that a busy machine's load hits both alike. Every number is a median.

  float64   the BLAS shim through flux_dnn.conv2d (the only float64 CPU shim) vs torch's
            F.conv2d: "vs torch" = torch ms / flux ms (above 1: flux_dnn faster)
  float32   the BLAS shim vs the oneDNN shim, both through flux_dnn's core
            (_core.run_conv, each shim's cached plan, output allocated per call as conv2d
            does): "vs oneDNN" = oneDNN ms / BLAS ms
  float16,  the BLAS shim's converted 16-bit path vs its own float32 on the same problem:
  bfloat16  "vs own f32" = f32 ms / 16-bit ms

"speed-up" = 1-thread ms / N-thread ms of the same callable ("peer speed-up": the peer's, a
check that the machine had the cores to give). Threads: torch.set_num_threads, which sets the
OpenMP team size of the one OpenMP runtime torch and the shims share (torch is imported
first), flux_dnn's plan cache emptied at each switch. It is a benchmark, never a test:
nothing asserts on time.

    python benchmarks/bench_blas_threads.py --markdown --json benchmarks/results/blas_threads.json
    python benchmarks/bench_blas_threads.py --dtypes float64 --layers 3x3 --batch 4 --budget 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys

import torch  # first: flux_dnn's shims then run on torch's OpenMP runtime
import torch.nn.functional as F

import flux_dnn  # noqa: E402
from flux_dnn import _core  # noqa: E402
from flux_dnn._bench import RESNET50_SAMPLE as LAYERS  # noqa: E402
from flux_dnn._bench import cpu_info, geomean, interleaved, out_size  # noqa: E402
from flux_dnn._discovery import REGISTRY  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cpu_shim(name: str):
    """The loaded CPU shim of that name (flux_dnn's registry), or None."""
    return next((e.shim for e in REGISTRY.usable_for(1, loud=False)[0] if e.name == name), None)


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t.contiguous()


def shim_call(shim, layer, x, w):
    """A forward call of one shim through flux_dnn's core, output allocated per call (in x's
    memory format, as flux_dnn.conv2d does)."""
    L = layer
    spec = _core.ConvSpec(_core.CONV_FORWARD, 2, [L.stride] * 2, [1, 1], [L.pad] * 2, [L.pad] * 2, L.groups)
    ho = out_size(L.H, L.R, L.stride, L.pad)
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1 else None
    shape = (x.shape[0], L.K, ho, ho)

    def call():
        y = torch.empty(shape, dtype=x.dtype, memory_format=fmt or torch.contiguous_format)
        _core.run_conv(shim, spec, x, w, y, None, None, None)
        return y

    return call


def callables(dtype: str, layer, n: int, layout: str, blas, onednn, gen) -> dict:
    """The callables of one row: {name: fn} at one thread count (flux, peer)."""
    L = layer
    rnd = lambda *s, dt=DTYPES[dtype]: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    x = _layout(rnd(n, L.C, L.H, L.H), layout)
    w = _layout(rnd(L.K, L.C // L.groups, L.R, L.R) * 0.1, layout)
    if dtype == "float64":
        return {
            "flux": lambda: flux_dnn.conv2d(x, w, None, L.stride, L.pad, 1, L.groups),
            "torch": lambda: F.conv2d(x, w, None, L.stride, L.pad, 1, L.groups),
        }
    if dtype == "float32":
        fns = {"flux": shim_call(blas, L, x, w)}
        if onednn is not None:
            fns["onednn"] = shim_call(onednn, L, x, w)
        return fns
    x32, w32 = x.float(), w.float()
    x32, w32 = _layout(x32, layout), _layout(w32, layout)
    return {"flux": shim_call(blas, L, x, w), "flux_f32": shim_call(blas, L, x32, w32)}


def check(fns: dict) -> float:
    """Relative difference of flux's result to the peer's (a sanity check, not a test)."""
    peer = next(k for k in fns if k != "flux")
    a, b = fns["flux"]().double(), fns[peer]().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def measure(dtype, layer, n, layout, threads, budget, blas, onednn, gen) -> dict:
    """One row: flux and its peer interleaved at 1 thread, then at `threads`. The plan cache is
    emptied before each thread count: the oneDNN shim sizes a primitive's thread split when the
    plan is created (and flux_dnn caches plans), so a plan made at one count keeps it."""
    fns = callables(dtype, layer, n, layout, blas, onednn, gen)
    row = dict(dtype=dtype, layer=layer.name, N=n, layout=layout, threads=threads)
    peer = next(k for k in fns if k != "flux")
    for t in (1, threads):
        torch.set_num_threads(t)
        _core.clear_plan_cache()
        if t == 1:
            row["diff"] = check(fns)
        res = interleaved(fns, budget, min_reps=5, max_reps=200)
        row |= {f"{k}@{t}": v for k, v in res.items()}
        row[f"ratio@{t}"] = res[peer] / res["flux"]  # peer ms / flux ms
    row["speedup"] = row["flux@1"] / row[f"flux@{threads}"]
    row["peer"] = peer
    row["peer_speedup"] = row[f"{peer}@1"] / row[f"{peer}@{threads}"]
    return row


RATIO_NAME = {"float64": "vs torch", "float32": "vs oneDNN", "float16": "vs own f32", "bfloat16": "vs own f32"}


def print_markdown(rows, threads) -> None:
    print(
        f"| dtype | layer | N | layout | flux 1t ms | flux {threads}t ms | speed-up | peer speed-up "
        f"| ratio 1t | ratio {threads}t |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['layer']} | {r['N']} | {r['layout']} | {r['flux@1']:.2f} | "
            f"{r[f'flux@{threads}']:.2f} | {r['speedup']:.2f} | {r['peer_speedup']:.2f} | "
            f"{r['ratio@1']:.2f} | {r[f'ratio@{threads}']:.2f} |"
        )
    print()
    print(f"| dtype | ratio | geomean 1t | geomean {threads}t | min 1t | min {threads}t | speed-up 3x3+1x1 (min) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dt in dict.fromkeys(r["dtype"] for r in rows):
        rs = [r for r in rows if r["dtype"] == dt]
        conv = [r["speedup"] for r in rs if r["layer"].startswith(("3x3", "1x1"))]
        print(
            f"| {dt} | {RATIO_NAME[dt]} | {geomean([r['ratio@1'] for r in rs]):.2f} | "
            f"{geomean([r[f'ratio@{threads}'] for r in rs]):.2f} | {min(r['ratio@1'] for r in rs):.2f} | "
            f"{min(r[f'ratio@{threads}'] for r in rs):.2f} | "
            f"{geomean(conv):.2f} ({min(conv):.2f}) |"
            if conv
            else f"| {dt} | {RATIO_NAME[dt]} | - |"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float64,float32,float16,bfloat16")
    ap.add_argument("--layers", default="", help="substring filter on layer names (comma list)")
    ap.add_argument("--batch", default="4,16")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="the all-cores thread count")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per row")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    blas, onednn = cpu_shim("blas"), cpu_shim("onednn")
    if blas is None:
        print("the BLAS shim is not usable here", file=sys.stderr)
        return 1
    layers = [L for L in LAYERS if not args.layers or any(f in L.name for f in args.layers.split(","))]
    c = cpu_info()
    load = os.getloadavg()
    print(f"# CPU: {c['model']}, {c['cpus']} logical CPUs; ISA: {' '.join(c['isa_present'])}")
    print(f"# load average at start: {' '.join(f'{v:.2f}' for v in load)}")
    openblas = blas.info()["vendor_version_runtime"]
    print(f"# torch {torch.__version__}; flux_dnn {flux_dnn.__version__}; BLAS shim on OpenBLAS {openblas}")
    print(f"# threads: 1 and {args.threads} (torch.set_num_threads); oneDNN shim: {'yes' if onednn else 'absent'}")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in args.dtypes.split(","):
        for layer in layers:
            for n in map(int, args.batch.split(",")):
                for layout in args.layouts.split(","):
                    r = measure(dtype, layer, n, layout, args.threads, args.budget, blas, onednn, gen)
                    rows.append(r)
                    print(
                        f"{dtype:8s} {layer.name:22s} N={n:<2d} {layout}  flux {r['flux@1']:8.2f} / "
                        f"{r[f'flux@{args.threads}']:8.2f} ms  speed-up {r['speedup']:.2f}  "
                        f"{RATIO_NAME[dtype]} {r['ratio@1']:.2f} / {r[f'ratio@{args.threads}']:.2f}  "
                        f"(peer speed-up {r['peer_speedup']:.2f}, diff {r['diff']:.1e})",
                        flush=True,
                    )
    end_load = os.getloadavg()
    print(f"# load average at end: {' '.join(f'{v:.2f}' for v in end_load)}")
    if args.markdown:
        print()
        print_markdown(rows, args.threads)
    if args.json:
        meta = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            cpu=c,
            load_start=load,
            load_end=end_load,
            torch=torch.__version__,
            flux_dnn=flux_dnn.__version__,
            threads=args.threads,
            budget=args.budget,
        )
        pathlib.Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

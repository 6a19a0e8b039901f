#!/usr/bin/env python
"""flux_dnn.jax vs jax.lax on the CPU: ResNet-50-like layers under jax.jit, same process.

Each layer runs as JAX users write it (NHWC inputs, HWIO weights, lax's arguments):
``jax.jit(flux_dnn.jax.conv_general_dilated)`` against ``jax.jit(jax.lax.conv_general_dilated)``
on the same arrays, forward and ``jax.grad`` (the gradients of <conv(x, w), g> in x and w).
Calls are interleaved and every number is a median (flux_dnn._bench's loop, as bench_cpu.py);
ratio = lax time / flux time, above 1.0 means flux_dnn is faster. The results are compared
first (max difference relative to the largest magnitude). A benchmark, not a test.

    python benchmarks/bench_jax.py                  # N=8, forward and grad, every layer
    python benchmarks/bench_jax.py --quick --markdown
    python benchmarks/bench_jax.py --batch 32 --json results/<date>-<machine>-jax.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

import flux_dnn
import flux_dnn.jax as fj
from flux_dnn._bench import RESNET50_SAMPLE as LAYERS
from flux_dnn._bench import cpu_info, geomean, interleaved

DN = ("NHWC", "HWIO", "NHWC")


def functions(layer, n: int, rng):
    """(flux, lax) jitted callables of (x, w, g) for the forward and grad ops, and the arrays."""
    x = jnp.asarray(rng.standard_normal((n, layer.H, layer.H, layer.C)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((layer.R, layer.R, layer.C // layer.groups, layer.K)).astype(np.float32))
    kw = dict(
        window_strides=(layer.stride,) * 2,
        padding=((layer.pad, layer.pad),) * 2,
        dimension_numbers=DN,
        feature_group_count=layer.groups,
    )
    conv = {"flux": fj.conv_general_dilated, "lax": jax.lax.conv_general_dilated}
    y = conv["lax"](x, w, **kw)
    g = jnp.asarray(rng.standard_normal(y.shape).astype(np.float32))
    forward = {k: jax.jit(lambda x, w, f=f: f(x, w, **kw)) for k, f in conv.items()}
    grad = {k: jax.jit(jax.grad(lambda x, w, f=f: jnp.vdot(f(x, w, **kw), g), (0, 1))) for k, f in conv.items()}
    return {"forward": forward, "grad": grad}, (x, w)


def difference(a, b) -> float:
    a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    scale = max(float(jnp.abs(v).max()) for v in b) or 1.0
    return max(float(jnp.abs(u - v).max()) for u, v in zip(a, b)) / scale


def run_layer(layer, op, fns, args, budget, min_reps) -> dict:
    results = {k: fns[k](*args) for k in fns}  # compiles, and the check
    diff = difference(results["flux"], results["lax"])

    def timed(fn):
        return lambda: jax.block_until_ready(fn(*args))

    times = interleaved({k: timed(f) for k, f in fns.items()}, budget, min_reps, 2000)
    return dict(layer=layer.name, op=op, flux_ms=times["flux"], lax_ms=times["lax"], ratio=times["lax"] / times["flux"],
                max_rel_diff=diff, reps=times["_reps"])  # fmt: skip


def machine() -> dict:
    info = cpu_info()
    shim = flux_dnn._discovery.REGISTRY.shim_for(flux_dnn._core.DEVICE_CPU, "float32")
    return dict(
        cpu=info["model"],
        cpus=info["cpus"],
        isa=info["isa_present"],
        shim=shim.name,
        shim_device=shim.device_info()["name"],
        jax=jax.__version__,
        flux_dnn=flux_dnn.__version__,
        path="XLA FFI" if fj.ffi_available() else "pure_callback",
        threads=os.environ.get("OMP_NUM_THREADS", "all"),
        python=platform.python_version(),
        date=datetime.date.today().isoformat(),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ops", default="forward,grad")
    p.add_argument("--quick", action="store_true", help="three layers, a short budget")
    p.add_argument("--budget", type=float, default=2.0, help="seconds of timing per layer and op")
    p.add_argument("--min-reps", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", help="write the machine and the rows here")
    args = p.parse_args(argv)
    layers = [LAYERS[i] for i in (1, 3, 5)] if args.quick else LAYERS
    budget = 0.5 if args.quick else args.budget
    m = machine()
    print(f"# {m['cpu']} ({m['cpus']} CPUs, {' '.join(m['isa'])}), threads {m['threads']}; {m['date']}")
    print(f"# flux_dnn {m['flux_dnn']} via {m['path']}, shim {m['shim']} ({m['shim_device']}); jax {m['jax']}")
    print(f"# N={args.batch}, float32, {DN}; ratio = lax / flux (above 1: flux_dnn faster)")
    rng = np.random.default_rng(0)
    rows = []
    for layer in layers:
        ops, arrays = functions(layer, args.batch, rng)
        for op in args.ops.split(","):
            row = run_layer(layer, op, ops[op], arrays, budget, args.min_reps)
            rows.append(row)
            print(f"{row['layer']:<24} {op:<8} flux {row['flux_ms']:9.3f} ms  lax {row['lax_ms']:9.3f} ms  "
                  f"ratio {row['ratio']:5.2f}  max rel diff {row['max_rel_diff']:.1e}", flush=True)  # fmt: skip
    for op in args.ops.split(","):
        ratios = [r["ratio"] for r in rows if r["op"] == op]
        print(f"# {op}: geomean ratio {geomean(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    if args.markdown:
        print("\n| layer | op | flux_dnn ms | lax ms | lax / flux | max rel diff |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['layer']} | {r['op']} | {r['flux_ms']:.3f} | {r['lax_ms']:.3f} | {r['ratio']:.2f} | "
                  f"{r['max_rel_diff']:.0e} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": m, "batch": args.batch, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

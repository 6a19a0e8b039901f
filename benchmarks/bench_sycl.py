#!/usr/bin/env python
"""The onednn_sycl shim on a SYCL device against the native oneDNN shim, same process.

On the SYCL CPU device (Intel's OpenCL CPU runtime) both shims run oneDNN's CPU kernels: the
native shim oneDNN 3.2 with OpenMP on NumPy arrays, the SYCL shim oneDNN 3.9 through SYCL's
host tasks on dpnp arrays (USM memory, work on the arrays' own queue). The ratio native ms /
SYCL ms says what the SYCL path costs on top (issue 28's target: >= 0.8 on the ResNet-50
layer set). Both go through flux_dnn.conv2d, output allocated per call in each array
library, and the SYCL calls wait on the queue before the clock stops (a call returns once its
work is queued). dpnp's arrays are on its default queue, which is out of order (the script
prints the kind). Calls are interleaved (flux_dnn._bench.interleaved); every number is a
median; --repeat R runs the whole set R times and reports, per row, the median of the runs'
medians (with each run's load average in the JSON). The first call of each layer is checked:
both against a float64 NumPy reference.

--out also times both shims writing into outputs made once (out=), in the same interleave:
the shims' own cost without the array libraries' allocation. dpnp has no caching allocator:
a fresh USM allocation's pages fault on first write, every call (measured: the stem's N=1
output alone costs ~1.2 ms to allocate and fill, about the native shim's whole call), while
NumPy's freed memory is reused by malloc. flux_dnn's dpnp provider therefore reuses dropped
outputs' memory (flux_dnn_sycl's output pool); FLUX_DNN_SYCL_OUTPUT_POOL_BYTES=0 turns that
off, to time what dpnp's own allocation costs.

The tiny rows time the per-call overhead of x 1x4x8x8, w 4x4x3x3, pad 1: µs per call of each
shim, the SYCL one with its queue wait (one call's latency: submission, the SYCL runtime's
host task, the wait) and pipelined (100 calls, then one wait, per call: what a caller that
does not wait pays on the host, while the runtime runs the work beside it).

Both shims share the machine's cores in one process: the native shim's OpenMP team and the
SYCL CPU runtime's TBB workers. OpenMP's default is to spin after each parallel region, which
takes the cores from the TBB workers of the next call (measured on a 2-core machine: the
native 3x3 layer 1 ms with OMP_WAIT_POLICY=passive, 30-44 ms spinning against the other
runtime); so the script sets OMP_WAIT_POLICY=passive unless it is set, and prints it.

On a 2-vCPU VM the SYCL per-call time is bimodal (measured 2026-12-05: a tiny call 110-120 µs
or 180-230 µs, flipping within one process): fast while the scheduler keeps the SYCL runtime's
host-task threads on the calling thread's vCPU, slow while it keeps them on the other one, each
primitive then a cross-vCPU wake-up. So every run prints and records where the process's
threads last ran (``thread_cpus``: one digit per thread, in thread-id order) beside its tiny
call, and the header prints SYCL_QUEUE_THREAD_POOL_SIZE (the runtime's host-task pool; 1 keeps
every host task on one thread and so in one TBB arena: packaging/flux-dnn-sycl/README.md).

It is a benchmark, never a test: nothing asserts on time.

    python benchmarks/bench_sycl.py --markdown --json benchmarks/results/<date>-<machine>-sycl.json
    python benchmarks/bench_sycl.py --batch 1 --layers 3x3 --budget 0.5
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

# Before libgomp loads (with the oneDNN shim): see the docstring.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402

import flux_dnn  # noqa: E402
from flux_dnn._bench import RESNET50_SAMPLE, cpu_info, cpu_text, geomean, interleaved, load_text, write_json

try:
    import dpnp
except ImportError as exc:  # the benchmark needs the SYCL array library
    sys.exit(f"bench_sycl: dpnp is not installed ({exc}); make the venv with scripts/sycl_env.sh")

TINY_X, TINY_W = (1, 4, 8, 8), (4, 4, 3, 3)
DTYPES = {"float32": np.float32}


def shim_versions() -> dict:
    """name -> 'vendor version at run time' of the two shims compared."""
    return {
        s.name: f"{s.vendor} {s.vendor_version_runtime}".strip()
        for s in flux_dnn.shims()
        if s.name in ("onednn", "onednn_sycl")
    }


def reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int, groups: int) -> np.ndarray:
    """The convolution in float64, written here (im2col by slicing, one einsum per group)."""
    n, c, h, _ = x.shape
    k, cg, r, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - r) // stride + 1
    cols = np.stack(
        [xp[:, :, i : i + stride * ho : stride, j : j + stride * ho : stride] for i in range(r) for j in range(r)],
        axis=2,
    )  # n, c, r*r, ho, ho
    cols = cols.reshape(n, groups, cg, r * r, ho, ho)
    wg = w.astype(np.float64).reshape(groups, k // groups, cg, r * r)
    return np.einsum("ngcpyx,gkcp->ngkyx", cols, wg).reshape(n, k, ho, ho)


def check(name: str, got: np.ndarray, ref: np.ndarray) -> float:
    err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
    if not err < 1e-4:
        sys.exit(f"bench_sycl: {name} is wrong (relative error {err:.2e}); no timing of a wrong result")
    return err


def time_layer(layer, batch: int, dtype, budget: float, min_reps: int, given_out: bool = False) -> dict:
    rng = np.random.default_rng()
    x = rng.standard_normal((batch, layer.C, layer.H, layer.H)).astype(dtype)
    w = rng.standard_normal((layer.K, layer.C // layer.groups, layer.R, layer.R)).astype(dtype)
    xd, wd = dpnp.asarray(x), dpnp.asarray(w)
    queue = xd.sycl_queue
    kw = dict(stride=layer.stride, padding=layer.pad, groups=layer.groups)

    def native():
        return flux_dnn.conv2d(x, w, **kw)

    def sycl():
        y = flux_dnn.conv2d(xd, wd, **kw)
        queue.wait()
        return y

    ref = reference(x, w, layer.stride, layer.pad, layer.groups)
    err_native = check(f"{layer.name} native", native(), ref)
    err_sycl = check(f"{layer.name} sycl", dpnp.asnumpy(sycl()), ref)
    fns = {"native": native, "sycl": sycl}
    if given_out:  # the same calls into outputs made once (out=): the shims without allocation
        y, yd = np.empty(ref.shape, dtype), dpnp.empty(ref.shape, dtype=dtype, sycl_queue=queue)
        fns["native out"] = lambda: flux_dnn.conv2d(x, w, **kw, out=y)
        fns["sycl out"] = lambda: (flux_dnn.conv2d(xd, wd, **kw, out=yd), queue.wait())
    t = interleaved(fns, budget, min_reps, 1000)
    given = {}
    if given_out:
        native_out, sycl_out = t["native out"], t["sycl out"]
        given = dict(native_out_ms=native_out, sycl_out_ms=sycl_out, ratio_out=native_out / sycl_out)
    return given | dict(
        layer=layer.name,
        batch=batch,
        native_ms=t["native"],
        sycl_ms=t["sycl"],
        ratio=t["native"] / t["sycl"],
        reps=t["_reps"],
        err_native=err_native,
        err_sycl=err_sycl,
    )


def time_tiny(budget: float) -> dict:
    rng = np.random.default_rng()
    x = rng.standard_normal(TINY_X).astype(np.float32)
    w = rng.standard_normal(TINY_W).astype(np.float32)
    xd, wd = dpnp.asarray(x), dpnp.asarray(w)
    queue = xd.sycl_queue

    def sycl():
        flux_dnn.conv2d(xd, wd, padding=1)
        queue.wait()

    def pipelined():  # 100 calls, one wait
        for _ in range(100):
            flux_dnn.conv2d(xd, wd, padding=1)
        queue.wait()

    t = interleaved({"native": lambda: flux_dnn.conv2d(x, w, padding=1), "sycl": sycl}, budget, 200, 20000, warmup=20)
    p = interleaved({"pipelined": pipelined}, budget / 2, 5, 200, warmup=2)
    return dict(
        native_us=t["native"] * 1e3, sycl_us=t["sycl"] * 1e3, sycl_pipelined_us=p["pipelined"] * 10, reps=t["_reps"]
    )


def thread_cpus() -> str | None:
    """The CPU each of this process's threads last ran on (Linux: field 39 of
    /proc/self/task/<tid>/stat), one per thread in thread-id order, as one string ("0010000000"
    for ten threads); None where /proc cannot say."""
    try:
        tids = sorted(os.listdir("/proc/self/task"), key=int)
        cpus = []
        for tid in tids:
            with open(f"/proc/self/task/{tid}/stat") as f:
                # The command name (field 2) may hold spaces: count fields after its ')'.
                cpus.append(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None
    return " ".join(cpus) if any(len(c) > 1 for c in cpus) else "".join(cpus)


def median_row(rows) -> dict:
    """One layer's row over the runs: the median of each time, the ratio of the medians."""
    out = dict(rows[0])
    for k in ("native_ms", "sycl_ms", "err_native", "err_sycl", "native_out_ms", "sycl_out_ms"):
        if k in out:
            out[k] = statistics.median(r[k] for r in rows)
    out["ratio"] = out["native_ms"] / out["sycl_ms"]
    if "native_out_ms" in out:
        out["ratio_out"] = out["native_out_ms"] / out["sycl_out_ms"]
    out["ratios_per_run"] = [r["ratio"] for r in rows]
    return out


def markdown(rows: list, tiny: dict | None) -> str:
    given = bool(rows) and "ratio_out" in rows[0]
    head = "| layer | N | native ms | SYCL ms | native / SYCL |"
    rule = "|---|---:|---:|---:|---:|"
    if given:
        head += " out= given: native ms | SYCL ms | native / SYCL |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for r in rows:
        line = f"| {r['layer']} | {r['batch']} | {r['native_ms']:.2f} | {r['sycl_ms']:.2f} | {r['ratio']:.2f} |"
        if given:
            line += f" {r['native_out_ms']:.2f} | {r['sycl_out_ms']:.2f} | {r['ratio_out']:.2f} |"
        lines.append(line)
    if rows:
        ratios = [r["ratio"] for r in rows]
        line = f"| **geomean** (min {min(ratios):.2f}) | | | | **{geomean(ratios):.2f}** |"
        if given:
            outs = [r["ratio_out"] for r in rows]
            line += f" | | **{geomean(outs):.2f}** (min {min(outs):.2f}) |"
        lines.append(line)
    if tiny:
        lines += [
            "",
            "| tiny 1x4x8x8 * 4x4x3x3 | µs per call |",
            "|---|---:|",
            f"| native oneDNN shim, NumPy | {tiny['native_us']:.1f} |",
            f"| onednn_sycl shim, dpnp (with queue wait) | {tiny['sycl_us']:.1f} |",
            f"| onednn_sycl shim, dpnp (pipelined: 100 calls, one wait) | {tiny['sycl_pipelined_us']:.1f} |",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,8", help="comma list of batch sizes (default 1,8)")
    ap.add_argument("--layers", default="", help="substring filter on layer names (comma list)")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per layer (default 2)")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1, help="runs of the whole set; rows are medians of runs")
    ap.add_argument(
        "--out",
        action="store_true",
        help="also time both shims into outputs made once (out=), interleaved with the allocating calls",
    )
    ap.add_argument("--no-tiny", action="store_true", help="skip the per-call overhead row")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table at the end")
    ap.add_argument("--json", default=None, help="write raw results to this file")
    args = ap.parse_args()

    device = dpnp.asarray(np.zeros(1, np.float32)).sycl_device
    versions = shim_versions()
    if "onednn_sycl" not in versions or "onednn" not in versions:
        sys.exit(f"bench_sycl: needs both the onednn and onednn_sycl shims usable; have {versions}")
    print(f"CPU: {cpu_text()}; load {load_text()}; OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    in_order = dpnp.asarray(np.zeros(1, np.float32)).sycl_queue.is_in_order
    print(f"SYCL device: {device.name} ({device.backend}, {device.device_type}); shims: {versions}")
    print(f"dpnp outputs' memory pool: FLUX_DNN_SYCL_OUTPUT_POOL_BYTES={_pool_setting()}")
    print(f"dpnp's default queue: {'in order' if in_order else 'out of order'}")
    print(f"SYCL host-task pool: SYCL_QUEUE_THREAD_POOL_SIZE={_host_task_pool_setting()}")
    wanted = [s for s in args.layers.split(",") if s]
    layers = [L for L in RESNET50_SAMPLE if not wanted or any(s in L.name for s in wanted)]
    runs, tinies, loads, placements = [], [], [], []
    for run in range(args.repeat):
        loads.append(load_text())
        rows = []
        for batch in (int(b) for b in args.batch.split(",")):
            for layer in layers:
                row = time_layer(layer, batch, DTYPES[args.dtype], args.budget, args.min_reps, args.out)
                rows.append(row)
                print(
                    f"{layer.name:28s} N={batch:<3d} native {row['native_ms']:8.2f} ms  sycl {row['sycl_ms']:8.2f} ms"
                    f"  native/sycl {row['ratio']:.2f}" + (f"  out= given: {row['ratio_out']:.2f}" if args.out else ""),
                    flush=True,
                )
        runs.append(rows)
        tiny = None if args.no_tiny else time_tiny(min(args.budget, 2.0))
        if tiny:
            tinies.append(tiny)
            print(
                f"tiny: native {tiny['native_us']:.1f} µs, sycl {tiny['sycl_us']:.1f} µs per call "
                f"(pipelined {tiny['sycl_pipelined_us']:.1f} µs)",
                flush=True,
            )
        loads[-1] += f" -> {load_text()}"
        placements.append(thread_cpus())
        print(f"run {run + 1}/{args.repeat}: load {loads[-1]}; threads' CPUs {placements[-1]}", flush=True)
    rows = [median_row(r) for r in zip(*runs)]
    tiny = {k: statistics.median(t[k] for t in tinies) for k in tinies[0]} if tinies else None
    print(f"geomean native/sycl: {geomean([r['ratio'] for r in rows]):.2f}")
    if args.out:
        print(f"geomean native/sycl, out= given: {geomean([r['ratio_out'] for r in rows]):.2f}")
    if args.markdown:
        print(markdown(rows, tiny))
    write_json(
        args.json,
        dict(
            date=datetime.date.today().isoformat(),
            cpu=cpu_info(),
            load=load_text(),
            loads_per_run=loads,
            queue_in_order=bool(dpnp.asarray(np.zeros(1, np.float32)).sycl_queue.is_in_order),
            runs=runs,
            omp_wait_policy=os.environ["OMP_WAIT_POLICY"],
            output_pool_bytes=_pool_setting(),
            device=device.name,
            shims=versions,
            dtype=args.dtype,
            rows=rows,
            tiny=tiny,
            tiny_per_run=tinies,
            thread_cpus_per_run=placements,
            sycl_queue_thread_pool_size=_host_task_pool_setting(),
        ),
    )


def _pool_setting():
    return os.environ.get("FLUX_DNN_SYCL_OUTPUT_POOL_BYTES") or "default (1 GiB)"


def _host_task_pool_setting():
    return os.environ.get("SYCL_QUEUE_THREAD_POOL_SIZE") or "unset (the runtime's default)"


if __name__ == "__main__":
    main()

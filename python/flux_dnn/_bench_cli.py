"""``python -m flux_dnn bench``: flux_dnn against the library the user already has.

The peer is torch when it is installed, else JAX, else a NumPy float64 reference that only
checks flux_dnn's results (there is then nothing to time against). Both libraries get the
same inputs on the device asked for; each row's results are compared first, then the calls
are interleaved (flux_dnn, peer, flux_dnn, ...) and every time is a median
(flux_dnn._bench.interleaved, as benchmarks/bench_cpu.py times). ratio = peer ms / flux_dnn
ms: above 1 flux_dnn is faster. One line per row goes to stderr as it is measured; the
table, headed by the machine, the shims and their vendor versions, goes to stdout at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

from . import _bench, _core, _progress

OPS = ("forward", "backward_data", "backward_weight")
DTYPES = ("float32", "float16", "bfloat16", "float64")
LAYOUTS = ("nchw", "nhwc")
PEERS = ("auto", "torch", "jax", "numpy")
#: --device -> flux_dnn's device type (DLPack's)
DEVICES = {
    "cpu": _core.DEVICE_CPU,
    "cuda": _core.DEVICE_CUDA,
    "rocm": _core.DEVICE_ROCM,
    "mps": _core.DEVICE_METAL,
    "xpu": _core.DEVICE_ONEAPI,
}
#: max |flux - peer| / max |peer| accepted per dtype: summation order differs between
#: libraries, and on NVIDIA both use TF32 for float32 by default (10 mantissa bits)
TOLERANCE = {"float64": 1e-9, "float32": 5e-3, "float16": 2e-2, "bfloat16": 6e-2}


def _comma_list(text: str, allowed, option: str) -> list:
    values = [v.strip() for v in text.split(",") if v.strip()]
    for v in values:
        if v not in allowed:
            raise SystemExit(f"{option}: unknown value {v!r}; allowed: {', '.join(allowed)}")
    if not values:
        raise SystemExit(f"{option}: empty; allowed: {', '.join(allowed)}")
    return values


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m flux_dnn bench",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--device", default="cpu", help=f"where to run: {', '.join(DEVICES)} (default cpu)")
    p.add_argument("--peer", default="auto", help="torch, jax, numpy (reference only), or auto: the first installed")
    p.add_argument(
        "--layers",
        default=None,
        help=f"a layer set: {', '.join(_bench.LAYER_SETS)} (default resnet50, or none when --shape is given)",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="c=C,h=H,k=K,r=R[,stride=S,pad=P,groups=G]",
        help="a layer of your own: x (N, C, H, H), w (K, C/groups, R, R); may be repeated",
    )
    p.add_argument("--ops", default="forward,backward_data,backward_weight", help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--dtypes", default="float32", help=f"comma list of {', '.join(DTYPES)}")
    p.add_argument("--layout", default="nchw", help="nchw, nhwc (channels-last) or both, comma-separated")
    p.add_argument("--batch", type=int, default=None, help="N (default 1 with --quick on CPU, 8 on CPU, 32 on GPUs)")
    p.add_argument("--algorithm", default="heuristic", help="flux_dnn's algorithm: heuristic or benchmark")
    p.add_argument("--budget", type=float, default=None, help="seconds of timing per row (default 1.5, --quick 0.25)")
    p.add_argument("--quick", action="store_true", help="three layers of the set, a short budget")
    p.add_argument("--json", default=None, help="write the machine and every row to this file")
    p.add_argument("--no-progress", action="store_true", help="no line per row on stderr (FLUX_DNN_PROGRESS=0 too)")
    args = p.parse_args(argv)
    _check_args(args)
    return args


def _check_args(args) -> None:
    if args.device not in DEVICES:
        raise SystemExit(f"--device: unknown device {args.device!r}; allowed: {', '.join(DEVICES)}")
    if args.peer not in PEERS:
        raise SystemExit(f"--peer: unknown peer {args.peer!r}; allowed: {', '.join(PEERS)}")
    if args.layers is not None and args.layers not in _bench.LAYER_SETS:
        raise SystemExit(f"--layers: unknown layer set {args.layers!r}; allowed: {', '.join(_bench.LAYER_SETS)}")
    if args.algorithm not in ("heuristic", "benchmark"):
        raise SystemExit(f"--algorithm: {args.algorithm!r} is not one of heuristic, benchmark")
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"--batch: {args.batch} is not a batch size (an integer >= 1)")
    if args.budget is not None and args.budget <= 0:
        raise SystemExit(f"--budget: {args.budget} is not a number of seconds > 0")
    args.ops = _comma_list(args.ops, OPS, "--ops")
    args.dtypes = _comma_list(args.dtypes, DTYPES, "--dtypes")
    args.layout = _comma_list(args.layout, LAYOUTS, "--layout")
    try:
        args.shapes = [_bench.parse_shape(s) for s in args.shape]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def layers_of(args) -> list:
    """The layer set's layers (its quick three with --quick), then the --shape layers."""
    if args.layers is None and args.shapes:
        return list(args.shapes)
    name = args.layers or "resnet50"
    chosen = _bench.LAYER_SETS[name]
    if args.quick:
        chosen = [layer for layer in chosen if layer.name in _bench.QUICK[name]]
    return chosen + list(args.shapes)


def choose_peer(requested: str, device: str) -> str:
    """The peer: the one asked for, or the first of torch, JAX installed; NumPy (a reference
    for correctness, on CPU) when neither is."""
    if requested != "auto":
        if requested != "numpy" and importlib.util.find_spec(requested) is None:
            raise SystemExit(f"--peer: {requested} is not installed here; allowed: the installed ones, or numpy")
        return requested
    for name in ("torch", "jax"):
        if importlib.util.find_spec(name) is not None:
            return name
    return "numpy"


# ------------------------------------------------------------------------------------------
# Checking


def max_rel_diff(a, b) -> float:
    """max |a - b| / max |b| of two NumPy arrays, in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = float(np.abs(b).max()) if b.size else 0.0
    return float(np.abs(a - b).max()) / (scale or 1.0) if b.size else 0.0


# ------------------------------------------------------------------------------------------
# The run


def measure(peer, layer, op, dtype, layout, n, timing) -> dict:
    """One row: the results compared, then flux_dnn and the peer timed interleaved."""
    case = peer.case(op, layer, n, dtype, layout)
    first = {}
    t0 = time.perf_counter()
    got = case["flux"]()
    first["flux"] = (time.perf_counter() - t0) * 1e3
    diff = max_rel_diff(peer.to_numpy(got), case["expected"]())
    row = dict(max_rel_diff=diff, check="ok" if diff <= TOLERANCE[dtype] else "MISMATCH")
    fns = {"flux": case["flux"]} | ({"peer": case["peer"]} if case.get("peer") else {})
    t = _bench.interleaved(fns, timing["budget"], timing["min_reps"], timing["max_reps"], timing["warmup"],
                           own_reps=True, first_ms=first, timer=peer.timer)  # fmt: skip
    row |= dict(flux_ms=t["flux"], reps_flux=t["_reps flux"])
    if "peer" in t:
        row |= dict(peer_ms=t["peer"], ratio=t["peer"] / t["flux"], ratio_min=t["_min peer"] / t["_min flux"])
        row["reps_peer"] = t["_reps peer"]
    return row


def run_rows(peer, args, report) -> list:
    """Every (dtype, layout, layer, op) row, each reported as it is measured; a failure is a
    row with its error, and the run goes on."""
    quick = args.quick
    timing = dict(
        budget=args.budget or (0.25 if quick else 1.5),
        min_reps=3 if quick else 10,
        max_reps=30 if quick else 400,
        warmup=1 if quick else 3,
    )
    todo = [
        (d, lay, layer, op) for d in args.dtypes for lay in args.layout for layer in args.layers_list for op in args.ops
    ]
    rows = []
    for i, (dtype, layout, layer, op) in enumerate(todo, 1):
        base = dict(layer=layer.name, op=op, dtype=dtype, layout=layout, N=args.batch, shim=peer.shim_name(dtype))
        try:
            with _progress.working(f"measuring {layer.name} {op} {dtype} {layout}"):
                row = base | measure(peer, layer, op, dtype, layout, args.batch, timing)
        except Exception as exc:  # noqa: BLE001 -- one failure must not hide the other rows
            row = base | dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
        rows.append(row)
        report(i, len(todo), row, peer.name)
    return rows


def progress_line(i: int, total: int, row: dict, peer: str) -> str:
    head = f"[{i:{len(str(total))}d}/{total}] {row['layer']} {row['op']} {row['dtype']} {row['layout']}:"
    if "error" in row:
        return f"{head} FAILED: {row['error']}"
    peer_part = f", {peer} {row['peer_ms']:.3f} ms, ratio {row['ratio']:.2f}" if "peer_ms" in row else ""
    return f"{head} flux_dnn {row['flux_ms']:.3f} ms{peer_part}, rel diff {row['max_rel_diff']:.1e} {row['check']}"


def print_table(rows: list, peer: str) -> None:
    timed = peer != "numpy"
    head = "| layer | op | dtype | layout | shim | flux_dnn ms |"
    head += f" {peer} ms | {peer} / flux_dnn |" if timed else ""
    print(head + " max rel diff | check |")
    print("|---|---|---|---|---|---:|" + ("---:|---:|" if timed else "") + "---:|---|")
    for r in rows:
        cells = [r["layer"], r["op"], r["dtype"], r["layout"], r["shim"]]
        if "error" in r:
            cells += ["-"] * (3 if timed else 1) + ["-", f"FAILED: {r['error'][:100]}"]
        else:
            cells.append(f"{r['flux_ms']:.3f}")
            if timed:
                cells += [f"{r['peer_ms']:.3f}", f"{r['ratio']:.2f}"]
            cells += [f"{r['max_rel_diff']:.1e}", r["check"]]
        print("| " + " | ".join(cells) + " |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if timed and ratios:
        cells = [f"geomean of {len(ratios)} rows"] + [""] * 6 + [f"{_bench.geomean(ratios):.2f}", "", ""]
        print("| " + " | ".join(cells) + " |")


def summary(rows: list) -> dict:
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return dict(
        rows=len(rows),
        failed=sum("error" in r for r in rows),
        mismatched=sum(r.get("check") == "MISMATCH" for r in rows),
        geomean=_bench.geomean(ratios) if ratios else None,
        min=min(ratios) if ratios else None,
    )


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from . import _bench_peers

    peer = _bench_peers.make(choose_peer(args.peer, args.device), args.device, args.algorithm)
    if args.batch is None:  # a quick CPU run must stay short on a small machine
        args.batch = (1 if args.quick else 8) if args.device == "cpu" else 32
    args.layers_list = layers_of(args)
    load_start = _bench.load_text()
    rows = _with_progress(args.no_progress, lambda report: run_rows(peer, args, report))
    header = peer.header(args) + [
        f"load average {load_start} at start, {_bench.load_text()} at end{_busy_note()}",
        "command: python -m flux_dnn bench " + " ".join(sys.argv[1:] if argv is None else argv),
    ]
    for line in header:
        print(f"# {line}")
    print()
    print_table(rows, peer.name)
    summ = summary(rows)
    _bench.write_json(args.json, dict(header=header, machine=peer.machine(), rows=rows, summary=summ))
    return 0 if summ["rows"] and not summ["failed"] and not summ["mismatched"] else 1


def _with_progress(off: bool, run):
    """run(report) with a line per row on stderr, and the lines of algorithm="benchmark"
    tuning even when stderr is not a terminal (the user started long work and is waiting);
    none with --no-progress or FLUX_DNN_PROGRESS=0. The process's setting comes back after."""
    before = _progress._forced
    if off:
        _progress.configure("off")
    elif _progress.mode() == "auto":
        _progress.configure("lines")
    on = _progress.mode() != "off"

    def report(i, total, row, peer):
        if on:
            print(progress_line(i, total, row, peer), file=sys.stderr, flush=True)

    try:
        return run(report)
    finally:
        _progress.configure(before)


def _busy_note() -> str:
    """A warning when other work holds the CPUs: times are then noisy, and threads of a
    parallel region that wait for a descheduled one make them so at random."""
    try:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return ""
    if load < 0.75 * cpus:
        return ""
    return (
        f" (busy: {load:.1f} on {cpus} CPUs, times are noisy; on a shared machine OMP_NUM_THREADS=1 "
        "steadies the CPU rows)"
    )

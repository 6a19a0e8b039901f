#!/usr/bin/env python
"""Where the oneDNN shim's small-problem path (im2col + dnnl_sgemm, algorithm 8) stops
paying: per problem size, the time of a plan call on algorithm 8 against the fastest of the
primitive's layout policies (algorithms 0 to 3), float32 NCHW, 3x3 padding 1 (an analysis aid
behind the shim's kSmallProblemMacs, not a test).

    OMP_NUM_THREADS=1 python benchmarks/bench_small.py
    OMP_NUM_THREADS=2 python benchmarks/bench_small.py

Prints a markdown table: MACs, microseconds per call (minimum over blocks) of each, their
ratio, and the algorithm the heuristic picks for that problem.
"""

from __future__ import annotations

import time

import numpy as np

import flux_dnn

# (N, C, K, H=W): growing multiply-add counts around the crossover.
SHAPES = [
    (1, 4, 4, 8),
    (1, 8, 8, 8),
    (1, 4, 4, 16),
    (1, 16, 16, 8),
    (1, 8, 8, 16),
    (1, 16, 16, 12),
    (1, 4, 4, 32),
    (1, 16, 16, 16),
    (2, 16, 16, 16),
    (1, 32, 32, 16),
    (1, 16, 16, 32),
    (1, 64, 64, 8),
    (1, 32, 32, 32),
    (1, 64, 64, 16),
    (1, 64, 64, 32),
]


def best_time(plan, x, y, blocks=7) -> float:
    """Minimum µs per call over blocks of about 20 ms each."""
    for _ in range(20):
        plan(x, out=y)
    t0 = time.perf_counter()
    plan(x, out=y)
    n = max(5, int(0.02 / max(time.perf_counter() - t0, 1e-7)))
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(n):
            plan(x, out=y)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    rng = np.random.default_rng()
    print("| N C K HxW | MACs | primitive µs (best of algo 0-3) | sgemm µs (algo 8) | ratio | heuristic |")
    print("|---|---:|---:|---:|---:|---|")
    for n, c, k, hw in SHAPES:
        x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
        w = rng.standard_normal((k, c, 3, 3), dtype=np.float32)
        y = np.empty((n, k, hw, hw), np.float32)
        macs = n * k * c * 9 * hw * hw
        primitive = min(best_time(flux_dnn.conv_plan(x, w, padding=1, algorithm=a), x, y) for a in range(4))
        small = best_time(flux_dnn.conv_plan(x, w, padding=1, algorithm=8), x, y)
        chosen = flux_dnn.conv_plan(x, w, padding=1).algorithm
        print(
            f"| {n} {c} {k} {hw}x{hw} | {macs} | {primitive:.2f} | {small:.2f} | {small / primitive:.2f} | {chosen} |"
        )


if __name__ == "__main__":
    main()

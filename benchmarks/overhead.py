#!/usr/bin/env python
"""Per-call overhead of a tiny convolution, piece by piece (an analysis aid, not a test).

Times flux_dnn.conv2d / conv_plan on NumPy and torch against torch's F.conv2d on
x 1x4x8x8, w 4x4x3x3, pad 1, and the pieces a call is made of: the core call alone
(flux_dnn._core.run_conv with a prepared spec, read from flux_dnn internals), DLPack export,
output allocation, memo keys. Prints a markdown table of minimum and median µs per call.

    OMP_NUM_THREADS=1 python benchmarks/overhead.py
"""
import time, sys
import torch, numpy as np, flux_dnn
import torch.nn.functional as F
from flux_dnn import _conv, _core
from torch.utils.dlpack import to_dlpack
x = torch.randn(1,4,8,8); w = torch.randn(4,4,3,3); xn, wn = x.numpy(), w.numpy()
yn = np.empty((1,4,8,8), np.float32); y = torch.empty(1,4,8,8)
def t(fn, n=5000, blocks=15):
    for _ in range(500): fn()
    r=[]
    for b in range(blocks):
        t0=time.perf_counter_ns()
        for _ in range(n): fn()
        r.append((time.perf_counter_ns()-t0)/n/1e3)
    r.sort()
    return r[0], r[len(r)//2]
def prep_for(arrs, **kw):
    _conv._memo.clear()
    flux_dnn.conv2d(*arrs, padding=1, **kw)
    (k, p), = _conv._memo.items()
    return p
pn = prep_for((xn, wn)); pt = prep_for((x, w)); pn0 = prep_for((xn, wn), algorithm=0)
plan_n = flux_dnn.conv_plan(xn, wn, padding=1); plan_t = flux_dnn.conv_plan(x, w, padding=1)
print(plan_n)
rows = [
 ("torch F.conv2d", lambda: F.conv2d(x, w, None, 1, 1)),
 ("flux conv2d numpy", lambda: flux_dnn.conv2d(xn, wn, padding=1)),
 ("flux conv2d numpy, algorithm=0 (gemm, no reorder)", lambda: flux_dnn.conv2d(xn, wn, padding=1, algorithm=0)),
 ("flux conv2d torch", lambda: flux_dnn.conv2d(x, w, padding=1)),
 ("flux conv2d numpy out=", lambda: flux_dnn.conv2d(xn, wn, padding=1, out=yn)),
 ("conv_plan numpy", lambda: plan_n(xn)),
 ("conv_plan numpy out=", lambda: plan_n(xn, out=yn)),
 ("conv_plan torch", lambda: plan_t(x)),
 ("conv_plan torch out=", lambda: plan_t(x, out=y)),
 ("_core.run_conv numpy (core+shim+oneDNN)", lambda: _core.run_conv(pn.shim, pn.spec, xn, wn, yn, None, None, None)),
 ("_core.run_conv numpy, algorithm=0", lambda: _core.run_conv(pn0.shim, pn0.spec, xn, wn, yn, None, None, None)),
 ("_core.run_conv torch", lambda: _core.run_conv(pt.shim, pt.spec, x, w, y, None, None, None)),
 ("numpy a.__dlpack__(max_version=(1,0))", lambda: xn.__dlpack__(max_version=(1, 0))),
 ("torch t.__dlpack__(max_version=(1,0))", lambda: x.__dlpack__(max_version=(1, 0))),
 ("torch.utils.dlpack.to_dlpack(t)", lambda: to_dlpack(x)),
 ("np.empty", lambda: np.empty((1,4,8,8), np.float32)),
 ("torch.empty(shape, dtype=, device=)", lambda: torch.empty((1,4,8,8), dtype=x.dtype, device=x.device)),
 ("torch.empty(shape, dtype=)", lambda: torch.empty((1,4,8,8), dtype=x.dtype)),
 ("TorchAdapter.key(t) x1", lambda: _conv._BY_TYPE[type(x)].key(x)),
 ("NumpyAdapter.key(a) x1", lambda: _conv._BY_TYPE[type(xn)].key(xn)),
]
print("| call | min µs | median µs |")
print("|---|---:|---:|")
for name, fn in rows:
    mn, md = t(fn)
    print(f"| {name} | {mn:.2f} | {md:.2f} |", flush=True)

"""workspace_limit on every CPU shim, driven through the ABI (ctypes), below the core.

The header: a plan's workspace_size is at most workspace_limit, and a workspace beyond the
limit is FDNN_ERROR_UNSUPPORTED (so that a caller may pass the problem on to another shim).
On a sample of problems -- ops, ranks, groups, strides, dilations, padding, NCHW and
channels-last, the dtypes each shim computes -- each limit from 0 up to the unlimited plan's
workspace either gives a plan within it, which then computes the right result on a workspace
of exactly that size, or is refused as UNSUPPORTED naming the bytes it needs (more than the
limit, and enough: a plan with that limit exists) and the limit."""

from __future__ import annotations

import ctypes as C
import re

import numpy as np
import pytest

import reference as ref
from abi import fdnn_ctypes as F
from abi.fdnn_ctypes import ABI
from abi.shims import shim_sources

OPS = {
    "forward": ABI.CONV_FORWARD,
    "backward_data": ABI.CONV_BACKWARD_DATA,
    "backward_weight": ABI.CONV_BACKWARD_WEIGHT,
}
STORAGE = {"float64": np.float64, "float32": np.float32, "float16": np.float16}
TOLERANCE = {"float64": 1e-10, "float32": 2e-4, "float16": 4e-3}
NO_LIMIT = C.c_size_t(-1).value
REFUSAL = re.compile(r"needs at least (\d+) bytes of workspace, the limit \(workspace_limit\) is (\d+):")


def _cpu_shims():
    """Every installed shim library (the ABI suite's discovery, fakes aside) with a CPU device."""
    found = []
    for name, source in sorted(shim_sources().items()):
        if not source.library or source.missing or name.startswith("fake"):
            continue
        if source.preload is not None:
            source.preload()
        shim = F.Shim(source.library)
        info = shim.info()
        if info.device_type == ABI.DEVICE_CPU and info.num_devices > 0:
            found.append(pytest.param(shim, id=name))
    return found or [pytest.param(None, marks=pytest.mark.skip(reason="no CPU shim is installed"))]


class Problem:
    """One convolution with random grid values (exact in every dtype) in a memory layout, its
    float64 reference result, and the arrays a plan reads and writes."""

    def __init__(self, rng, op: str, dtype: str, shim):
        caps = {name: shim.capabilities(OPS[name], F.DTYPES[dtype]) for name in OPS}
        features = caps[op].features
        nd = int(rng.integers(1, 4))
        groups = int(rng.choice([1, 2])) if features & ABI.FEATURE_GROUPS else 1
        cg, kg, n = (int(v) for v in rng.integers(1, 5, 3))
        self.ks = tuple(int(v) for v in rng.integers(1, 4, nd))
        self.stride = tuple(int(v) for v in rng.integers(1, 3, nd))
        self.dilation = tuple(int(v) for v in rng.integers(1, 3, nd)) if features & ABI.FEATURE_DILATION else (1,) * nd
        self.lo = tuple(int(v) for v in rng.integers(0, 2, nd))
        self.hi = tuple(int(v) for v in rng.integers(0, 2, nd))
        spatial = tuple(max(int(rng.integers(3, 9)), d * (k - 1) + 1) for d, k in zip(self.dilation, self.ks))
        self.op, self.dtype, self.groups = op, dtype, groups
        layout = ref.channels_last if rng.random() < 0.5 else np.ascontiguousarray
        x = rng.integers(-4, 5, (n, cg * groups, *spatial)) / 4
        w = rng.integers(-4, 5, (kg * groups, cg, *self.ks)) / 4
        out_sp = tuple(ref.out_size(*v) for v in zip(spatial, self.ks, self.stride, self.dilation, self.lo, self.hi))
        y = rng.integers(-4, 5, (n, kg * groups, *out_sp)) / 4
        geometry = dict(stride=self.stride, lo=self.lo, hi=self.hi, dilation=self.dilation, groups=groups)
        if op == "forward":
            self.expected = ref.conv_forward(x, w, None, **geometry)
        elif op == "backward_data":
            self.expected = ref.conv_backward_data(y, w, x.shape, **geometry)
        else:
            self.expected = ref.conv_backward_weight(x, y, w.shape, **geometry)
        store = STORAGE[dtype]
        self.x, self.y = layout(x.astype(store)), layout(y.astype(store))
        self.w = np.ascontiguousarray(w.astype(store))
        self.out = {"forward": self.y, "backward_data": self.x, "backward_weight": self.w}[op]
        self.policy = (ABI.ALGO_HEURISTIC, 0)  # (algo_policy, algo_id)

    def __repr__(self):
        return (
            f"{self.op} {self.dtype} policy {self.policy} x{self.x.shape}/{self.x.strides} w{self.w.shape} "
            f"groups={self.groups} stride={self.stride} dilation={self.dilation} lo={self.lo} hi={self.hi}"
        )

    def plan_args(self, limit: int):
        keep = []
        policy, algo_id = self.policy

        def descriptor(a):
            shape = (C.c_int64 * a.ndim)(*a.shape)
            strides = (C.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
            keep.extend((shape, strides))
            code, bits = F.DTYPES[self.dtype]
            return F.DLTensor(
                data=a.ctypes.data,
                device=F.DLDevice(ABI.DEVICE_CPU, 0),
                ndim=a.ndim,
                dtype=F.DLDataType(code, bits, 1),
                shape=shape,
                strides=strides,
                byte_offset=0,
            )

        tensors = [descriptor(a) for a in (self.x, self.w, self.y)] + [F.DLTensor(ndim=0)]
        keep.extend(tensors)
        args = F.new(
            F.ConvPlanCreateArgs,
            op=OPS[self.op],
            spatial_rank=self.x.ndim - 2,
            x=C.pointer(tensors[0]),
            w=C.pointer(tensors[1]),
            y=C.pointer(tensors[2]),
            bias=C.pointer(tensors[3]),
            groups=self.groups,
            alpha=1.0,
            beta=0.0,
            algo_policy=policy,
            algo_id=algo_id,
            workspace_limit=limit,
        )
        for i in range(self.x.ndim - 2):
            args.stride[i], args.dilation[i] = self.stride[i], self.dilation[i]
            args.padding_lo[i], args.padding_hi[i] = self.lo[i], self.hi[i]
        args._keep = keep
        return args

    def plan(self, shim, limit: int):
        """(plan args, None) or (None, the error)."""
        args = self.plan_args(limit)
        error = shim.call("Conv_Plan_Create", args)
        return (None, error) if error is not None else (args, None)

    def execute_and_check(self, shim, args, what: str) -> None:
        """Runs the plan on a workspace of exactly its size (64-aligned, the ABI's rule) with the
        output poisoned, and compares it with the reference."""
        size = args.workspace_size
        raw = np.empty(size + 64, np.uint8)
        start = raw.ctypes.data + (-raw.ctypes.data) % 64
        self.out[...] = np.nan
        e = F.new(
            F.ConvPlanExecuteArgs,
            plan=args.plan,
            x=self.x.ctypes.data,
            w=self.w.ctypes.data,
            y=self.y.ctypes.data,
            bias=None,
            workspace=start if size else None,
            workspace_size=size,
        )
        error = shim.call("Conv_Plan_Execute", e)
        assert error is None, (what, error)
        tol = TOLERANCE[self.dtype] * max(1.0, float(np.abs(self.expected).max()))
        np.testing.assert_allclose(self.out.astype(np.float64), self.expected, rtol=0, atol=tol, err_msg=what)


def _dtypes(shim):
    return [
        d for d in STORAGE if all(shim.capabilities(op, F.DTYPES[d]).support != ABI.SUPPORT_NONE for op in OPS.values())
    ]


@pytest.mark.parametrize("shim", _cpu_shims())
def test_workspace_never_exceeds_the_limit(shim, rng):
    name = shim.info().shim_name.decode()
    problems = [Problem(rng, op, dtype, shim) for op in OPS for dtype in _dtypes(shim) for _ in range(12)]
    served = refused = 0
    for i, p in enumerate(problems):
        full, error = p.plan(shim, NO_LIMIT)
        assert error is None, (p, error)
        needed = full.workspace_size
        shim.destroy(full.plan)
        # the heuristic, benchmark, or the algorithm the heuristic chose given back
        p.policy = [(ABI.ALGO_HEURISTIC, 0), (ABI.ALGO_BENCHMARK, 0), (ABI.ALGO_GIVEN, full.chosen_algo_id)][i % 3]
        for limit in sorted({0, 1, needed // 3, needed // 2, max(needed - 1, 0), needed}):
            what = f"{name}: {p!r}, limit {limit} (unlimited plan: {needed} bytes)"
            args, error = p.plan(shim, limit)
            if error is None:
                assert args.workspace_size <= limit, what
                p.execute_and_check(shim, args, what)
                shim.destroy(args.plan)
                served += 1
                continue
            assert error[0] == "UNSUPPORTED", (what, error)
            m = REFUSAL.search(error[1])
            assert m and int(m.group(2)) == limit and int(m.group(1)) > limit, (what, error)
            assert limit < needed, (what, "refused a limit the unlimited plan fits", error)
            # "at least N" is true: with N bytes allowed the shim plans within them.
            least = int(m.group(1))
            args, error = p.plan(shim, least)
            assert error is None and args.workspace_size <= least, (what, least, error)
            shim.destroy(args.plan)
            refused += 1
    assert served and refused, (served, refused)  # both sides of the rule were exercised


@pytest.mark.parametrize("shim", _cpu_shims())
def test_cpu_shims_refuse_a_too_small_limit_alike(shim):
    """The same case on each CPU shim: an im2col-sized problem with 16 bytes allowed is
    refused as UNSUPPORTED in the same words (the shim's name aside)."""
    rng = np.random.default_rng(0)
    p = Problem(rng, "forward", "float32", shim)
    p.x = np.ascontiguousarray(np.zeros((2, 4, 9, 9), np.float32))
    p.w = np.zeros((6, 4, 3, 3), np.float32)
    p.y = np.zeros((2, 6, 9, 9), np.float32)
    p.groups, p.ks, p.stride, p.dilation, p.lo, p.hi = 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)
    args, error = p.plan(shim, 16)
    if error is None:  # a shim may have a kernel with no workspace at all: then it is within
        assert args.workspace_size <= 16
        shim.destroy(args.plan)
        return
    assert error[0] == "UNSUPPORTED", error
    assert re.search(r"^the \w+ shim " + REFUSAL.pattern, error[1]), error

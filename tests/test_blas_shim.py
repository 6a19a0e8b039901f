"""The CBLAS (OpenBLAS) CPU shim driven directly through its C table with ctypes: every op,
dtype (float64, float32 natively; float16, bfloat16 through float32), rank, group and layout
against the float64 reference, with NaN-poisoned outputs so unwritten elements show.

The library is found through FLUX_DNN_BLAS_SHIM, else next to the installed flux_dnn package."""

from __future__ import annotations

import ctypes as C
import importlib.util
import math
import os
import pathlib
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

import reference as ref
from abi import fdnn_ctypes as F
from abi.fdnn_ctypes import ABI

FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT = ABI.CONV_FORWARD, ABI.CONV_BACKWARD_DATA, ABI.CONV_BACKWARD_WEIGHT
ACTIVATIONS = {name.lower(): value for name, value in ABI.group("ACTIVATION_").items() if name != "NONE"}
DTYPE_CODES = F.DTYPES
STORAGE = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
RTOL = {"float64": 1e-12, "float32": 2e-4, "float16": 2e-3, "bfloat16": 1e-2}
DTYPES = tuple(DTYPE_CODES)


def _library_path():
    env = os.environ.get("FLUX_DNN_BLAS_SHIM")
    if env:
        return pathlib.Path(env)
    spec = importlib.util.find_spec("flux_dnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "libflux_dnn_blas.so"


@pytest.fixture(scope="module")
def shim():
    path = _library_path()
    if path is None or not path.exists():
        pytest.skip(f"the OpenBLAS shim library is not built/installed (looked for {path}; set FLUX_DNN_BLAS_SHIM)")
    try:  # as flux_dnn._blas does: OpenBLAS by path from its wheel
        import scipy_openblas32

        C.CDLL(str(pathlib.Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"), mode=C.RTLD_GLOBAL)
    except (ImportError, OSError):
        pass
    return F.Shim(str(path))


# ---------------------------------------------------------------------------------------------
# bfloat16 as uint16 bits


def to_bf16(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def from_bf16(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def store_as(a, dtype):
    return to_bf16(a) if dtype == "bfloat16" else np.asarray(a).astype(STORAGE[dtype])


def values(a, dtype):
    return from_bf16(a).astype(np.float64) if dtype == "bfloat16" else np.asarray(a, dtype=np.float64)


def random_input(rng, shape, dtype):
    """float64/float32: normal; 16-bit: a grid of quarters in [-1, 1] (exact in every dtype, so
    the float32 computation is exact and only the output rounding differs)."""
    if dtype in ("float16", "bfloat16"):
        return rng.integers(-4, 5, size=shape) / 4.0
    return rng.standard_normal(shape)


def layout(a, kind):
    """A copy of a (already in storage dtype) in a memory layout: 'dense', 'cl' (channels-last)
    or 'strided' (every other element of a larger buffer in the last dim)."""
    if kind == "dense":
        return np.ascontiguousarray(a)
    if kind == "cl":
        return ref.channels_last(a)
    big = np.zeros(a.shape[:-1] + (a.shape[-1] * 2 + 1,), dtype=a.dtype)
    view = big[..., 1::2]
    view[...] = a
    return view


# ---------------------------------------------------------------------------------------------
# Calling the shim


def descriptor(a, dtype, keep):
    if a is None:
        return F.DLTensor(ndim=0)
    shape = (C.c_int64 * a.ndim)(*a.shape)
    strides = (C.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
    keep += [shape, strides]
    code, bits = DTYPE_CODES[dtype]
    return F.DLTensor(
        data=a.ctypes.data,
        device=F.DLDevice(ABI.DEVICE_CPU, 0),
        ndim=a.ndim,
        dtype=F.DLDataType(code, bits, 1),
        shape=shape,
        strides=strides,
        byte_offset=0,
    )


def plan_args(
    op,
    x,
    w,
    y,
    bias,
    dtype,
    *,
    stride,
    dilation,
    lo,
    hi,
    groups,
    alpha=1.0,
    beta=0.0,
    act=ABI.ACTIVATION_NONE,
    act_a=0.0,
    act_b=0.0,
    limit=None,
    policy=ABI.ALGO_HEURISTIC,
    algo_id=0,
):
    keep = []
    tx, tw, ty, tb = (descriptor(a, dtype, keep) for a in (x, w, y, bias))
    keep += [tx, tw, ty, tb]
    nd = x.ndim - 2
    args = F.new(
        F.ConvPlanCreateArgs,
        op=op,
        spatial_rank=nd,
        x=C.pointer(tx),
        w=C.pointer(tw),
        y=C.pointer(ty),
        bias=C.pointer(tb),
        groups=groups,
        alpha=alpha,
        beta=beta,
        activation=act,
        activation_alpha=act_a,
        activation_beta=act_b,
        algo_policy=policy,
        algo_id=algo_id,
        workspace_limit=C.c_size_t(-1).value if limit is None else limit,
    )
    for i in range(nd):
        args.stride[i], args.dilation[i], args.padding_lo[i], args.padding_hi[i] = stride[i], dilation[i], lo[i], hi[i]
    args._keep = keep
    return args


def workspace(size):
    raw = np.empty(size + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw, raw.ctypes.data + offset


def destroy(shim, plan):
    shim.destroy(plan)


def execute(shim, plan, size, x, w, y, bias):
    raw, ws = workspace(size)
    ptr = lambda a: None if a is None else a.ctypes.data
    e = F.new(
        F.ConvPlanExecuteArgs,
        plan=plan,
        x=ptr(x),
        w=ptr(w),
        y=ptr(y),
        bias=ptr(bias),
        workspace=ws if size else None,
        workspace_size=size,
    )
    return shim.call("Conv_Plan_Execute", e)


def run(shim, op, x, w, y, bias, dtype, **kw):
    """Creates a plan, executes it once, destroys it; returns (error or None, plan args)."""
    args = plan_args(op, x, w, y, bias, dtype, **kw)
    error = shim.call("Conv_Plan_Create", args)
    if error is not None:
        return error, args
    args.name = args.algo_name.decode()  # owned by the plan: copied before it is destroyed
    try:
        return execute(shim, args.plan, args.workspace_size, x, w, y, bias), args
    finally:
        destroy(shim, args.plan)


# ---------------------------------------------------------------------------------------------
# A problem: random inputs, the reference result, one call


def geometry(nd, *, k=3, stride=None, dilation=None, lo=None, hi=None):
    return dict(
        stride=stride or (1,) * nd,
        dilation=dilation or (1,) * nd,
        lo=lo or (0,) * nd,
        hi=hi or (0,) * nd,
        ks=(k,) * nd if isinstance(k, int) else k,
    )


def activation_ref(v, name, a, b):
    if name is None:
        return v
    return {
        "relu": lambda: np.maximum(v, 0),
        "leaky_relu": lambda: np.where(v >= 0, v, a * v),
        "clip": lambda: np.minimum(np.maximum(v, a), b),
        "sigmoid": lambda: 1 / (1 + np.exp(-v)),
        "tanh": lambda: np.tanh(v),
        "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "gelu_erf": lambda: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
        "silu": lambda: v / (1 + np.exp(-v)),
    }[name]()


def check_close(out, expected, dtype, what="", magnitude=None):
    """out against expected, relative to each element and to the result's scale: the largest of
    |expected| and `magnitude` (a forward's values before its activation: an activation that
    squashes them, clip or sigmoid, leaves the sum's rounding error, which scales with them)."""
    got = values(out, dtype)
    assert not np.isnan(got).any(), f"{what}: unwritten (NaN) elements"
    tol = RTOL[dtype]
    scale = max(1.0, float(np.abs(expected).max()), 0.0 if magnitude is None else magnitude)
    err = np.abs(got - expected)
    bad = err > tol * np.abs(expected) + tol * 1e-2 * scale + (0 if dtype == "float64" else tol * 1e-2)
    assert not bad.any(), f"{what}: max error {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


def conv_case(
    shim,
    rng,
    op,
    dtype,
    nd,
    *,
    N=2,
    C=4,
    K=6,
    size=7,
    groups=2,
    g=None,
    x_layout="dense",
    y_layout="dense",
    w_layout="dense",
    bias=False,
    alpha=1.0,
    beta=0.0,
    act=None,
    act_a=0.0,
    act_b=0.0,
    limit=None,
    policy=ABI.ALGO_HEURISTIC,
    algo_id=0,
):
    g = g or geometry(nd)
    sp = (size,) * nd if isinstance(size, int) else size
    osp = tuple(
        ref.out_size(sp[i], g["ks"][i], g["stride"][i], g["dilation"][i], g["lo"][i], g["hi"][i]) for i in range(nd)
    )
    xv = random_input(rng, (N, C, *sp), dtype)
    wv = random_input(rng, (K, C // groups, *g["ks"]), dtype)
    yv = random_input(rng, (N, K, *osp), dtype)
    bv = random_input(rng, (K,), dtype) if bias else None
    geo = dict(stride=g["stride"], lo=g["lo"], hi=g["hi"], dilation=g["dilation"], groups=groups)
    x, w, y = (layout(store_as(v, dtype), kind) for v, kind in ((xv, x_layout), (wv, w_layout), (yv, y_layout)))
    b = store_as(bv, dtype) if bias else None
    # The written operand starts as NaN (beta = 0) or random old values (beta != 0).
    out_name = {FORWARD: "y", BACKWARD_DATA: "x", BACKWARD_WEIGHT: "w"}[op]
    out = {"x": x, "w": w, "y": y}[out_name]
    old = None
    if beta != 0:
        old = values(out, dtype).copy()
    else:
        out[...] = store_as(np.full(out.shape, np.nan), dtype)
    old_b = None
    if bias and op == BACKWARD_WEIGHT:
        if beta != 0:
            old_b = values(b, dtype).copy()
        else:
            b[...] = store_as(np.full(b.shape, np.nan), dtype)
    xq, wq, yq = (
        values(store_as(xv, dtype), dtype),
        values(store_as(wv, dtype), dtype),
        values(store_as(yv, dtype), dtype),
    )
    bq = values(store_as(bv, dtype), dtype) if bias else None
    kw = dict(stride=g["stride"], lo=g["lo"], hi=g["hi"], dilation=g["dilation"], groups=groups)
    magnitude = None
    if op == FORWARD:
        pre_activation = ref.conv_forward(xq, wq, bq, **kw)
        magnitude = float(np.abs(alpha * pre_activation).max())
        expected = alpha * activation_ref(pre_activation, act, act_a, act_b)
    elif op == BACKWARD_DATA:
        expected = alpha * ref.conv_backward_data(yq, wq, xq.shape, **kw)
    else:
        expected = alpha * ref.conv_backward_weight(xq, yq, wq.shape, **kw)
    if old is not None:
        expected = expected + beta * old
    error, args = run(
        shim,
        op,
        x,
        w,
        y,
        b,
        dtype,
        stride=geo["stride"],
        dilation=geo["dilation"],
        lo=geo["lo"],
        hi=geo["hi"],
        groups=groups,
        alpha=alpha,
        beta=beta,
        act=ACTIVATIONS.get(act, ABI.ACTIVATION_NONE),
        act_a=act_a,
        act_b=act_b,
        limit=limit,
        policy=policy,
        algo_id=algo_id,
    )
    assert error is None, error
    check_close(out, expected, dtype, f"{out_name} ({args.name})", magnitude)
    if bias and op == BACKWARD_WEIGHT:
        db = alpha * yq.sum(axis=(0, *range(2, nd + 2)))
        if old_b is not None:
            db = db + beta * old_b
        check_close(b, db, dtype, "bias gradient")
    return args


# ---------------------------------------------------------------------------------------------
# The table, info, capabilities (what every shim owes the header: tests/abi/test_abi.py)


def test_table_and_info(shim):
    assert (shim.api.abi_major, shim.api.abi_minor) == (ABI.ABI_MAJOR, ABI.ABI_MINOR)
    assert shim.api.Conv_Capabilities and shim.api.Conv_Plan_Pack_Weights
    info = shim.info()
    assert info.shim_name == b"blas" and info.vendor_name == b"OpenBLAS"
    assert info.device_type == ABI.DEVICE_CPU and info.num_devices == 1 and info.unavailable_reason is None
    assert info.priority == ABI.PRIORITY_PORTABLE  # oneDNN, where present, is asked first
    assert info.shim_version.decode() == F.flux_dnn_version()
    assert info.vendor_version_built and info.vendor_version_runtime
    d = F.new(F.DeviceDescribeArgs, device_id=0)
    assert shim.call("Device_Describe", d) is None
    assert d.name.startswith(b"CPU, OpenBLAS") and d.default_flags == 0


# Everything is this shim's own code around GEMM: every op, rank, activation and feature but
# reduced precision, for each dtype it computes.
EVERY_FEATURE = sum(ABI.group("FEATURE_").values()) & ~ABI.FEATURE_REDUCED_PRECISION


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize(
    "dtype,support,detail",
    [
        ((ABI.DTYPE_FLOAT, 64), ABI.SUPPORT_NATIVE, b"float64 GEMM (dgemm)"),
        ((ABI.DTYPE_FLOAT, 32), ABI.SUPPORT_NATIVE, b"float32 GEMM (sgemm)"),
        ((ABI.DTYPE_FLOAT, 16), ABI.SUPPORT_CONVERTED, b"float32 GEMM, one rounding"),
        ((ABI.DTYPE_BFLOAT, 16), ABI.SUPPORT_CONVERTED, b"float32 GEMM, one rounding"),
        (
            (ABI.DTYPE_INT, 32),
            ABI.SUPPORT_NONE,
            b"OpenBLAS convolutions take float64, float32, float16 and bfloat16 only",
        ),
        (
            (ABI.DTYPE_FLOAT, 8),
            ABI.SUPPORT_NONE,
            b"OpenBLAS convolutions take float64, float32, float16 and bfloat16 only",
        ),
    ],
)
def test_capabilities(shim, op, dtype, support, detail):
    a = shim.capabilities(op, dtype)
    assert not isinstance(a, tuple), a
    assert a.support == support
    if dtype[1] in (16, 32) and support != ABI.SUPPORT_NONE and own_gemm(shim):  # the AVX-512 kernel named
        assert a.detail.startswith(detail) and b"AVX-512 kernel" in a.detail, a.detail
    else:
        assert a.detail == detail
    if support == ABI.SUPPORT_NONE:
        assert (a.spatial_ranks, a.activations, a.features) == (0, 0, 0)
        return
    assert a.spatial_ranks == 0b1110
    assert a.activations == ((1 << ABI.NUM_ACTIVATIONS) - 1 if op == FORWARD else 1 << ABI.ACTIVATION_NONE)
    per_op = {FORWARD: ABI.FEATURE_PACK_WEIGHTS, BACKWARD_WEIGHT: ABI.FEATURE_BIAS_GRADIENT}
    assert a.features == EVERY_FEATURE & ~ABI.FEATURE_PACK_WEIGHTS & ~ABI.FEATURE_BIAS_GRADIENT | per_op.get(op, 0)


def own_gemm(shim):
    """Whether this process's shim runs float32 GEMMs on its AVX-512 kernel (sgemm_avx512.inc):
    an x86-64 CPU with AVX-512 (F and VL), FLUX_DNN_BLAS_GEMM not "openblas"."""
    return b"AVX-512" in shim.capabilities(FORWARD, (ABI.DTYPE_FLOAT, 32)).detail


# ---------------------------------------------------------------------------------------------
# Every op x dtype x rank, with groups, dilation, stride and asymmetric padding


GEOMETRIES = {
    1: geometry(1, k=3, stride=(2,), dilation=(2,), lo=(2,), hi=(1,)),
    2: geometry(2, k=(3, 2), stride=(2, 1), dilation=(1, 2), lo=(1, 0), hi=(0, 2)),
    3: geometry(3, k=(2, 3, 2), stride=(1, 2, 1), dilation=(2, 1, 1), lo=(0, 1, 1), hi=(1, 0, 0)),
}
SIZES = {1: 9, 2: (6, 7), 3: (4, 5, 4)}


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_ops(shim, rng, op, dtype, nd, lay):
    conv_case(
        shim,
        rng,
        op,
        dtype,
        nd,
        size=SIZES[nd],
        g=GEOMETRIES[nd],
        x_layout=lay,
        y_layout=lay,
        w_layout=lay,
        bias=op != BACKWARD_DATA,
    )


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("algo_id", [1, 2, 3])
@pytest.mark.parametrize("lay", ["dense", "cl", "strided"])
def test_each_lowering_any_layout(shim, rng, op, dtype, algo_id, lay):
    """Every lowering (1 rows, 2 cols per image, 3 cols over the batch) on every layout,
    including non-dense strides: the direct and the staged paths."""
    args = conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        size=(6, 5),
        g=GEOMETRIES[2],
        x_layout=lay,
        y_layout=lay,
        w_layout=lay,
        policy=ABI.ALGO_GIVEN,
        algo_id=algo_id,
        bias=op == BACKWARD_WEIGHT,
    )
    assert args.chosen_algo_id == algo_id


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("lay", ["dense", "cl", "strided"])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_pointwise(shim, rng, op, dtype, lay, beta):
    """1x1, stride 1, unpadded: a plain GEMM on the caller's arrays where the layout allows."""
    conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        N=3,
        C=8,
        K=6,
        size=(5, 4),
        groups=2,
        g=geometry(2, k=1),
        x_layout=lay,
        y_layout=lay,
        alpha=0.5,
        beta=beta,
        bias=op != BACKWARD_DATA,
    )


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
def test_depthwise(shim, rng, dtype, lay, op):
    conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        N=2,
        C=6,
        K=12,
        size=6,
        groups=6,
        g=geometry(2, k=3, stride=(2, 2), lo=(1, 1), hi=(1, 0)),
        x_layout=lay,
        y_layout=lay,
    )


DW_GEOMETRIES = {
    "s2": geometry(2, k=3, stride=(2, 2), lo=(1, 1), hi=(1, 0)),
    "dil2_asym": geometry(2, k=(3, 2), dilation=(2, 2), lo=(2, 0), hi=(1, 2)),
    "s1": geometry(2, k=3, lo=(1, 1), hi=(1, 1)),
    "s1_asym": geometry(2, k=3, lo=(2, 0), hi=(0, 1)),  # the register-blocked 3x3 forward
}


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lay", ["dense", "cl", "strided"])
@pytest.mark.parametrize("mult", [1, 2])
@pytest.mark.parametrize("geo", sorted(DW_GEOMETRIES))
def test_direct_depthwise(shim, rng, op, dtype, lay, mult, geo):
    """C/groups == 1: the direct loops (algo 4, the heuristic's choice), alpha/beta, bias (+ activation)."""
    beta = 0.5 if geo == "s1" else 0.0
    act = "leaky_relu" if op == FORWARD and geo != "s1" else None
    args = conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        N=2,
        C=5,
        K=5 * mult,
        size=(7, 6),
        groups=5,
        g=DW_GEOMETRIES[geo],
        x_layout=lay,
        y_layout=lay,
        w_layout=lay,
        alpha=1.5,
        beta=beta,
        bias=op != BACKWARD_DATA,
        act=act,
        act_a=0.25,
    )
    assert args.chosen_algo_id == 4
    args = conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        N=1,
        C=4,
        K=4 * mult,
        size=(5, 300),
        groups=4,
        g=DW_GEOMETRIES[geo],
        x_layout=lay,
        y_layout=lay,
        policy=ABI.ALGO_GIVEN,
        algo_id=4,
        bias=op != BACKWARD_DATA,
        alpha=0.75,
        beta=beta,
    )
    assert args.chosen_algo_id == 4


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("nd", [1, 3])
@pytest.mark.parametrize("lay", ["dense", "cl"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_direct_depthwise_ranks(shim, rng, op, nd, lay, dtype):
    conv_case(
        shim,
        rng,
        op,
        dtype,
        nd,
        N=2,
        C=3,
        K=6,
        size=SIZES[nd],
        groups=3,
        g=GEOMETRIES[nd],
        x_layout=lay,
        y_layout=lay,
        w_layout=lay,
        bias=op != BACKWARD_DATA,
        alpha=2.0,
        beta=1.0,
    )


# ---------------------------------------------------------------------------------------------
# The float32 GEMM (sgemm_avx512.inc on AVX-512 CPUs, else OpenBLAS)

# Shapes across the AVX-512 kernel's edges: 70 output channels (11 six-row strips and 4 rows
# over; in channels-last rows, a 64-column strip and 6 over), 135 pixels an image (2 strips of
# 64 and 7 over), 300 input channels (a 1x1 layer's k in two blocks of 256; a 3x3 layer's
# 2700 in eleven), with alpha, beta (old values in y), bias and an activation: every
# partial-tile and k-block path, beside the full tiles.
GEMM_EDGES = dict(N=2, C=300, K=70, size=(9, 15), groups=1, bias=True, alpha=1.5, beta=0.5, act="relu")


# Algorithm policies crossed with the edges: the heuristic, each GEMM lowering given (1 rows,
# 2 cols per image, 3 cols over the batch) and the benchmark policy.
GEMM_POLICIES = {
    "heuristic": (ABI.ALGO_HEURISTIC, 0),
    "rows": (ABI.ALGO_GIVEN, 1),
    "cols": (ABI.ALGO_GIVEN, 2),
    "cols_batch": (ABI.ALGO_GIVEN, 3),
    "benchmark": (ABI.ALGO_BENCHMARK, 0),
}


@pytest.mark.parametrize("policy", sorted(GEMM_POLICIES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
@pytest.mark.parametrize("k", [1, 3])
def test_gemm_edges(shim, rng, dtype, lay, k, policy):
    """Forward convolutions whose GEMMs end in partial tiles and span several k blocks, under
    every algorithm policy, against the float64 reference. A 16-bit 1x1 layer hands x itself
    to the AVX-512 kernel, which widens it as it packs ("pointwise" in the heuristic plan's
    name); without that kernel the 16-bit x is widened into the workspace first."""
    g = geometry(2, k=k, lo=(k // 2,) * 2, hi=(k // 2,) * 2)
    policy_code, algo_id = GEMM_POLICIES[policy]
    args = conv_case(
        shim, rng, FORWARD, dtype, 2, g=g, x_layout=lay, y_layout=lay, policy=policy_code, algo_id=algo_id,
        **GEMM_EDGES,
    )  # fmt: skip
    if algo_id:
        assert args.chosen_algo_id == algo_id, args.name
    if k == 1 and policy == "heuristic":
        assert ("pointwise" in args.name) == (dtype == "float32" or own_gemm(shim)), args.name


@pytest.mark.parametrize("policy", sorted(GEMM_POLICIES))
@pytest.mark.parametrize("op", [BACKWARD_DATA, BACKWARD_WEIGHT], ids=["bwd_data", "bwd_weight"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_gemm_edges_backward(shim, rng, op, lay, policy):
    """The backward ops' GEMMs (transposed operands on the thin side) on the same edges, under
    every algorithm policy."""
    kw = {**GEMM_EDGES, "bias": op == BACKWARD_WEIGHT, "act": None}
    policy_code, algo_id = GEMM_POLICIES[policy]
    g = geometry(2, k=3, lo=(1, 1), hi=(1, 1))
    args = conv_case(
        shim, rng, op, "float32", 2, g=g, x_layout=lay, y_layout=lay, policy=policy_code, algo_id=algo_id, **kw
    )
    if algo_id:
        assert args.chosen_algo_id == algo_id, args.name


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the AVX-512 kernel is x86-64 only")
def test_gemm_openblas_only():
    """FLUX_DNN_BLAS_GEMM=openblas keeps every GEMM on OpenBLAS (read once per process, so in a
    child): the GEMM tests and the pointwise ones pass there too. On a CPU without AVX-512 this
    is the path every test takes; here it is checked on any x86-64 machine."""
    env = {**os.environ, "FLUX_DNN_BLAS_GEMM": "openblas"}
    code = (
        "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', "
        "'gemm_edges or pointwise or capabilities', sys.argv[1]]))"
    )
    done = subprocess.run([sys.executable, "-c", code, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]


# ---------------------------------------------------------------------------------------------
# Winograd F(2x2, 3x3) (algorithm 5)

WINOGRAD_GEOMETRIES = {
    "same": geometry(2, k=3, lo=(1, 1), hi=(1, 1)),
    "valid": geometry(2, k=3),
    "asym": geometry(2, k=3, lo=(0, 2), hi=(2, 1)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lay", ["dense", "cl", "strided"])
@pytest.mark.parametrize("geo", sorted(WINOGRAD_GEOMETRIES))
@pytest.mark.parametrize("size", [(7, 9), (8, 20), (3, 4)], ids=["odd", "wide", "small"])
def test_winograd(shim, rng, dtype, lay, geo, size):
    """Both flavours (NC[D]HW vectors along tile rows of 8 tiles or more; channels-last, and
    narrow images in any layout, vectors along channels), outputs of odd sizes (the last tile
    half outside), padding on either side, groups, bias, alpha and beta."""
    args = conv_case(
        shim,
        rng,
        FORWARD,
        dtype,
        2,
        N=2,
        C=6,
        K=4,
        groups=2,
        size=size,
        g=WINOGRAD_GEOMETRIES[geo],
        x_layout=lay,
        y_layout=lay,
        w_layout=lay,
        bias=True,
        alpha=0.75,
        beta=-0.5 if geo == "asym" else 0.0,
        policy=ABI.ALGO_GIVEN,
        algo_id=5,
    )
    assert args.chosen_algo_id == 5 and "Winograd" in args.name, args.name


@pytest.mark.parametrize("act", ["relu", "clip", "gelu_erf", "silu"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_winograd_epilogue(shim, rng, act, lay):
    """The header's epilogue alpha * act(conv + bias) + beta * y_old on Winograd's output tiles."""
    args = conv_case(
        shim,
        rng,
        FORWARD,
        "float32",
        2,
        N=3,
        C=16,
        K=24,
        groups=1,
        size=(18, 17),
        g=WINOGRAD_GEOMETRIES["same"],
        x_layout=lay,
        y_layout=lay,
        bias=True,
        act=act,
        act_a=-0.25,
        act_b=0.5,
        alpha=1.5,
        beta=0.5,
        policy=ABI.ALGO_GIVEN,
        algo_id=5,
    )
    assert args.chosen_algo_id == 5


@pytest.mark.parametrize("policy", ["heuristic", "given", "benchmark"])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -1.5)])
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_winograd_options_crossed(shim, rng, policy, alpha, beta, act, dtype):
    """A problem the heuristic gives Winograd (NC[D]HW, 16 channels, 128 tiles) under every
    algorithm policy, crossed with alpha/beta, an activation and bias: the heuristic and
    algorithm 5 given run Winograd, the benchmark policy whichever lowering timed fastest."""
    given = {"heuristic": (ABI.ALGO_HEURISTIC, 0), "given": (ABI.ALGO_GIVEN, 5), "benchmark": (ABI.ALGO_BENCHMARK, 0)}
    policy_code, algo_id = given[policy]
    args = conv_case(
        shim,
        rng,
        FORWARD,
        dtype,
        2,
        N=2,
        C=16,
        K=16,
        groups=1,
        size=16,
        g=WINOGRAD_GEOMETRIES["same"],
        bias=True,
        act=act,
        alpha=alpha,
        beta=beta,
        policy=policy_code,
        algo_id=algo_id,
    )
    if policy != "benchmark":
        assert args.chosen_algo_id == 5, args.name


def test_winograd_heuristic(shim, rng):
    """The heuristic takes Winograd where it measured faster than im2col (blas_shim.cpp,
    winograd_pays), and only there."""
    same = WINOGRAD_GEOMETRIES["same"]

    def chosen(**kw):
        base = dict(N=2, C=16, K=16, groups=1, size=16, g=same)
        return conv_case(shim, rng, FORWARD, "float32", 2, **{**base, **kw}).chosen_algo_id

    assert chosen() == 5  # NC[D]HW, 16 channels a side, 2 x 8 x 8 tiles
    assert chosen(C=64, K=64, x_layout="cl", y_layout="cl") == 5
    assert chosen(x_layout="cl", y_layout="cl") != 5  # channels-last under 64 channels
    assert chosen(N=1, size=8) != 5  # 16 tiles: transforming the weights outweighs the GEMMs
    assert chosen(C=8) != 5  # too few channels
    assert chosen(g=geometry(2, k=3, stride=(2, 2), lo=(1, 1), hi=(1, 1))) != 5
    assert chosen(g=geometry(2, k=3, dilation=(2, 2), lo=(2, 2), hi=(2, 2))) != 5


def test_winograd_packed_and_chunked(shim, rng):
    """Packed weights hold the transformed weights; a workspace limit splits the tiles into
    chunks (here four tiles each)."""
    x = rng.standard_normal((2, 16, 9, 11))
    w = rng.standard_normal((16, 16, 3, 3))
    expected = ref.conv_forward(x, w, lo=(1, 1), hi=(1, 1))
    y = np.full((2, 16, 9, 11), np.nan)
    geo = dict(stride=(1, 1), dilation=(1, 1), lo=(1, 1), hi=(1, 1), groups=1)
    args = plan_args(FORWARD, x, w, y, None, "float64", policy=ABI.ALGO_GIVEN, algo_id=5, **geo)
    assert shim.call("Conv_Plan_Create", args) is None
    pack = F.new(F.ConvPlanPackWeightsArgs, plan=args.plan, w=w.ctypes.data)
    assert shim.call("Conv_Plan_Pack_Weights", pack) is None
    destroy(shim, args.plan)
    w_seen = w.copy()
    w[...] = np.nan  # the packed plan reads its own transformed copy
    assert execute(shim, pack.packed_plan, pack.workspace_size, x, None, y, None) is None
    destroy(shim, pack.packed_plan)
    check_close(y, expected, "float64", "packed")
    # U (16 x 16 x 16 doubles, 32 KiB) and four tiles of V and M (16 x 16 doubles each per
    # tile): the 60 tiles in 15 chunks
    limit = 16 * 16 * 16 * 8 + 4 * 2 * 16 * 16 * 8 + 128
    y[...] = np.nan
    error, args = run(
        shim, FORWARD, x, w_seen, y, None, "float64", policy=ABI.ALGO_GIVEN, algo_id=5, limit=limit, **geo
    )
    assert error is None, error
    assert args.workspace_size <= limit and "Winograd" in args.name
    check_close(y, expected, "float64", "four tiles per chunk")


@pytest.mark.parametrize(
    "change",
    ["stride", "dilation", "kernel", "backward_data", "rank1"],
)
def test_winograd_refuses_what_it_cannot_compute(shim, change):
    """Algorithm 5 given for a problem it does not compute: UNSUPPORTED, naming it, before any
    work."""
    nd = 1 if change == "rank1" else 2
    k = 5 if change == "kernel" else 3
    stride = (2,) * nd if change == "stride" else (1,) * nd
    dilation = (2,) * nd if change == "dilation" else (1,) * nd
    op = BACKWARD_DATA if change == "backward_data" else FORWARD
    size = (12,) * nd
    osp = tuple(ref.out_size(12, k, stride[i], dilation[i], 1, 1) for i in range(nd))
    x = np.full((1, 4, *size), 3.0, np.float32)
    w = np.ones((4, 4, *(k,) * nd), np.float32)
    y = np.full((1, 4, *osp), 7.0, np.float32)
    lo = (1,) * nd
    error, _ = run(
        shim,
        op,
        x,
        w,
        y,
        None,
        "float32",
        stride=stride,
        dilation=dilation,
        lo=lo,
        hi=lo,
        groups=1,
        policy=ABI.ALGO_GIVEN,
        algo_id=5,
    )
    assert error is not None and error[0] == "UNSUPPORTED" and "Winograd" in error[1], error
    assert (y == 7.0).all() and (x == 3.0).all()


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_bias_and_activation(shim, rng, act, dtype, lay):
    act_a, act_b = {"leaky_relu": (0.1, 0.0), "clip": (-0.5, 0.75)}.get(act, (0.0, 0.0))
    conv_case(
        shim,
        rng,
        FORWARD,
        dtype,
        2,
        size=6,
        g=geometry(2, lo=(1, 1), hi=(1, 1)),
        x_layout=lay,
        y_layout=lay,
        bias=True,
        alpha=0.75,
        act=act,
        act_a=act_a,
        act_b=act_b,
    )


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,beta", [(0.5, 1.0), (2.0, 0.0), (1.0, -0.5)])
def test_alpha_beta(shim, rng, op, dtype, alpha, beta):
    conv_case(
        shim,
        rng,
        op,
        dtype,
        2,
        size=5,
        g=geometry(2, lo=(1, 1), hi=(1, 1)),
        alpha=alpha,
        beta=beta,
        bias=op != BACKWARD_DATA,
        act="relu" if op == FORWARD and beta else None,
    )


@pytest.mark.parametrize("op", [FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_workspace_limit(shim, rng, op, dtype, lay):
    """A limit below the preferred workspace still computes (in smaller chunks); a limit below
    anything that fits is UNSUPPORTED (the header's code for a workspace beyond the limit),
    naming the bytes needed and the limit."""
    kw = dict(size=8, g=geometry(2, lo=(1, 1), hi=(1, 1)), x_layout=lay, y_layout=lay, bias=op == BACKWARD_WEIGHT)
    full = conv_case(shim, rng, op, dtype, 2, **kw)
    assert full.workspace_size > 0
    fixed_ratio = 0.6 if dtype == "float32" else 0.9
    small = conv_case(shim, rng, op, dtype, 2, limit=int(full.workspace_size * fixed_ratio), **kw)
    assert small.workspace_size <= int(full.workspace_size * fixed_ratio)
    x = np.zeros((2, 4, 8, 8), STORAGE[dtype])
    w = np.zeros((6, 2, 3, 3), STORAGE[dtype])
    y = np.zeros((2, 6, 8, 8), STORAGE[dtype])
    args = plan_args(op, x, w, y, None, dtype, stride=(1, 1), dilation=(1, 1), lo=(1, 1), hi=(1, 1), groups=2, limit=16)
    error = shim.call("Conv_Plan_Create", args)
    assert error is not None and error[0] == "UNSUPPORTED", error
    needs = r"needs at least \d+ bytes of workspace, the limit \(workspace_limit\) is 16:"
    assert re.search(needs, error[1]), error


def test_float16_is_float32_rounded_once(shim, rng):
    """float16 results are the float32 computation rounded once: on a grid where float32 is
    exact, they equal the float64 reference rounded to float16 (within 1 ulp)."""
    x = random_input(rng, (2, 8, 9, 9), "float16")
    w = random_input(rng, (16, 8, 3, 3), "float16")
    b = random_input(rng, (16,), "float16")
    expected = (ref.conv_forward(x, w, b, lo=(1, 1), hi=(1, 1)) * 0.75).astype(np.float16)
    out = np.full(expected.shape, np.nan, np.float16)
    error, _ = run(
        shim,
        FORWARD,
        x.astype(np.float16),
        w.astype(np.float16),
        out,
        b.astype(np.float16),
        "float16",
        stride=(1, 1),
        dilation=(1, 1),
        lo=(1, 1),
        hi=(1, 1),
        groups=1,
        alpha=0.75,
    )
    assert error is None, error
    ulps = np.abs(out.view(np.int16).astype(np.int32) - expected.view(np.int16).astype(np.int32))
    assert ulps.max() <= 1
    assert (ulps == 0).mean() > 0.99  # exactly the once-rounded value nearly everywhere


def test_16bit_conversions_special_values(shim):
    """A 1x1 identity convolution round-trips float16 and bfloat16 specials through the
    float32 path: subnormals, infinities, NaN, signed zero."""
    h = np.array(
        [0.0, -0.0, 6e-8, -6e-8, 6.1e-5, 65504, -65504, np.inf, -np.inf, np.nan, 1 / 3, 1e-7], np.float16
    ).reshape(1, 1, 12)
    w = np.ones((1, 1, 1), np.float16)
    out = np.full(h.shape, np.nan, np.float16)
    error, _ = run(shim, FORWARD, h, w, out, None, "float16", stride=(1,), dilation=(1,), lo=(0,), hi=(0,), groups=1)
    assert error is None, error
    # Values (a GEMM sums from +0, so -0 comes back as +0); subnormals and infinities exact.
    assert np.array_equal(out[~np.isnan(h)], h[~np.isnan(h)])
    assert np.isnan(out[np.isnan(h)]).all()
    f = np.array([0.0, -0.0, 1e-40, -3e-39, 1.0, 3.4e38, np.inf, -np.inf, np.nan, 1 / 3], np.float32)
    bb = to_bf16(f).reshape(1, 1, -1)
    out_b = np.zeros_like(bb)
    error, _ = run(
        shim,
        FORWARD,
        bb,
        to_bf16(np.ones(1)).reshape(1, 1, 1),
        out_b,
        None,
        "bfloat16",
        stride=(1,),
        dilation=(1,),
        lo=(0,),
        hi=(0,),
        groups=1,
    )
    assert error is None, error
    nan = np.isnan(from_bf16(bb))
    assert np.array_equal(from_bf16(out_b)[~nan], from_bf16(bb)[~nan]) and np.isnan(from_bf16(out_b)[nan]).all()


def test_half_rounding_of_sums(shim):
    """Rounding to nearest even of float32 results into float16 (ties and carries)."""
    # 1 + k * 2^-12 for k = 0..7: ties at odd k round to even mantissas.
    vals = (1 + np.arange(8) * 2.0**-12).astype(np.float32)
    x = np.stack([vals, np.zeros_like(vals)]).reshape(1, 2, 8).astype(np.float32)
    xs = np.stack([np.ones(8), vals - 1]).reshape(1, 2, 8)  # 1 + (vals - 1): exact in float32
    w = np.ones((1, 2, 1), np.float16)
    xh = xs.astype(np.float16)
    assert np.array_equal(xh.astype(np.float64), xs)  # inputs exact in float16 (2^-12 ok)
    out = np.full((1, 1, 8), np.nan, np.float16)
    error, _ = run(shim, FORWARD, xh, w, out, None, "float16", stride=(1,), dilation=(1,), lo=(0,), hi=(0,), groups=1)
    assert error is None, error
    assert np.array_equal(out.ravel(), x[0, 0].astype(np.float16))


def test_packed_weights(shim, rng):
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    y = np.full((2, 6, 6, 6), np.nan, np.float32)
    args = plan_args(FORWARD, x, w, y, None, "float32", stride=(1, 1), dilation=(1, 1), lo=(1, 1), hi=(1, 1), groups=1)
    assert shim.call("Conv_Plan_Create", args) is None
    pack = F.new(F.ConvPlanPackWeightsArgs, plan=args.plan, w=w.ctypes.data)
    assert shim.call("Conv_Plan_Pack_Weights", pack) is None
    destroy(shim, args.plan)
    w_seen = w.copy()
    w[...] = np.nan  # the packed plan reads its own copy
    assert execute(shim, pack.packed_plan, pack.workspace_size, x, None, y, None) is None
    destroy(shim, pack.packed_plan)
    check_close(y, ref.conv_forward(x, w_seen, lo=(1, 1), hi=(1, 1)), "float32", "packed")


def test_benchmark_policy(shim, rng):
    args = conv_case(shim, rng, FORWARD, "float32", 2, size=6, policy=ABI.ALGO_BENCHMARK)
    assert args.chosen_algo_id in (1, 2, 3, 5)
    args = conv_case(shim, rng, FORWARD, "float32", 2, C=4, K=4, groups=4, size=6, policy=ABI.ALGO_BENCHMARK)
    assert args.chosen_algo_id in (1, 2, 3, 4, 5)


# ---------------------------------------------------------------------------------------------
# Invalid arguments: INVALID_ARGUMENT (or UNSUPPORTED), nothing written


def _bad_cases():
    def mod(**change):
        return change

    return {
        "stride0": mod(stride=(0, 1)),
        "negative_padding": mod(lo=(-1, 0)),
        "wrong_out_size": mod(y_shape=(2, 6, 5, 6)),
        "groups_mismatch": mod(groups=3),
        "bad_rank": mod(rank=4),
        "batch_mismatch": mod(y_shape=(3, 6, 6, 6)),
        "dilation0": mod(dilation=(1, 0)),
        "activation_on_backward": mod(op=BACKWARD_DATA, act=ABI.ACTIVATION_RELU),
        "bias_on_backward_data": mod(op=BACKWARD_DATA, bias=True),
        "bias_wrong_size": mod(bias_shape=(5,)),
        "dtype_mismatch": mod(w_dtype="float64"),
        "unknown_algo": mod(policy=ABI.ALGO_GIVEN, algo_id=7),
        "null_plan_args": mod(null_x=True),
    }


@pytest.mark.parametrize("case", sorted(_bad_cases()))
def test_invalid_arguments(shim, case):
    c = _bad_cases()[case]
    x = np.ones((2, 4, 6, 6), np.float32)
    w = np.ones((6, 2, 3, 3), np.float32)
    y = np.full(c.get("y_shape", (2, 6, 6, 6)), 7.0, np.float32)
    b = np.ones(c.get("bias_shape", (6,)), np.float32) if c.get("bias") or "bias_shape" in c else None
    args = plan_args(
        c.get("op", FORWARD),
        x,
        w,
        y,
        b,
        "float32",
        stride=c.get("stride", (1, 1)),
        dilation=c.get("dilation", (1, 1)),
        lo=c.get("lo", (1, 1)),
        hi=(1, 1),
        groups=c.get("groups", 2),
        act=c.get("act", ABI.ACTIVATION_NONE),
        policy=c.get("policy", ABI.ALGO_HEURISTIC),
        algo_id=c.get("algo_id", 0),
    )
    if "w_dtype" in c:
        args.w.contents.dtype = F.DLDataType(*F.DTYPES["float64"], 1)
    if "rank" in c:
        args.spatial_rank = c["rank"]
    if c.get("null_x"):
        args.x = C.POINTER(F.DLTensor)()
    args.plan = 12345
    args.workspace_size = 777
    error = shim.call("Conv_Plan_Create", args)
    assert error is not None and error[0] == "INVALID_ARGUMENT", error
    assert args.plan == 12345 and args.workspace_size == 777  # no out field written
    assert (y == 7.0).all() and (x == 1.0).all() and (w == 1.0).all()


def test_unsupported_dtype_names_it(shim):
    x = np.ones((1, 2, 4), np.int32)
    args = plan_args(
        FORWARD,
        x,
        np.ones((2, 2, 1), np.int32),
        np.ones((1, 2, 4), np.int32),
        None,
        "float32",
        stride=(1,),
        dilation=(1,),
        lo=(0,),
        hi=(0,),
        groups=1,
    )
    for t in (args.x, args.w, args.y):
        t.contents.dtype = F.DLDataType(ABI.DTYPE_INT, 32, 1)
    error = shim.call("Conv_Plan_Create", args)
    assert error is not None and error[0] == "UNSUPPORTED" and "float32" in error[1], error


def test_execute_rejects_small_workspace_and_null_data(shim):
    x = np.ones((1, 2, 6, 6), np.float32)
    w = np.ones((2, 2, 3, 3), np.float32)
    y = np.full((1, 2, 6, 6), 7.0, np.float32)
    args = plan_args(FORWARD, x, w, y, None, "float32", stride=(1, 1), dilation=(1, 1), lo=(1, 1), hi=(1, 1), groups=1)
    assert shim.call("Conv_Plan_Create", args) is None
    try:
        assert args.workspace_size > 0
        error = execute(shim, args.plan, args.workspace_size - 1, x, w, y, None)
        assert error is not None and error[0] == "INVALID_ARGUMENT", error
        error = execute(shim, args.plan, args.workspace_size, None, w, y, None)
        assert error is not None and error[0] == "INVALID_ARGUMENT", error
        assert (y == 7.0).all()
    finally:
        destroy(shim, args.plan)
    small = F.ConvPlanCreateArgs(struct_size=F.struct_size(F.ConvPlanCreateArgs) - 1)
    error = shim.call("Conv_Plan_Create", small)
    assert error is not None and error[0] == "INVALID_ARGUMENT"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # JAX, if a test imported it, warns at any fork
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_runs_in_forked_child(shim, rng):
    """After the parent ran threaded copy loops, a forked child still computes (one thread
    there: GNU libgomp's team does not survive fork)."""
    import time
    import warnings

    kw = dict(size=(40, 40), g=geometry(2, lo=(1, 1), hi=(1, 1)), N=4, C=16, K=16, groups=1)
    conv_case(shim, rng, FORWARD, "float32", 2, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            conv_case(shim, rng, FORWARD, "float32", 2, **kw)
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")

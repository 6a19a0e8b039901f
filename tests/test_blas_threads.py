"""The BLAS shim's work split across the OpenMP team (issue 24): every op and lowering on one
thread and on several, against a float64 reference written here, on fresh random inputs with
NaN-poisoned outputs, and the results of 1 and N threads bitwise identical (the shim claims
DETERMINISTIC: its GEMM panels and chunks depend on the problem only, never on the team size).

The team size is the calling thread's OpenMP ICV (omp_set_num_threads on the process's one
libgomp), as torch.set_num_threads and OMP_NUM_THREADS set it."""

from __future__ import annotations

import contextlib
import ctypes as C
import itertools
import pathlib

import numpy as np
import pytest

from abi import fdnn_ctypes as F
from abi.fdnn_ctypes import ABI
from test_blas_shim import (
    BACKWARD_DATA,
    BACKWARD_WEIGHT,
    FORWARD,
    _library_path,
    check_close,
    layout,
    random_input,
    run,
    store_as,
    values,
)


@pytest.fixture(scope="module")
def blas():
    """The shim's C table (as test_blas_shim loads it, OpenBLAS first from its wheel)."""
    path = _library_path()
    if path is None or not path.exists():
        pytest.skip(f"the OpenBLAS shim library is not built/installed (looked for {path})")
    with contextlib.suppress(ImportError, OSError):
        import scipy_openblas32

        C.CDLL(str(pathlib.Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"), mode=C.RTLD_GLOBAL)
    return F.Shim(str(path))


def _openmp():
    """The process's OpenMP runtime the shim runs on (GNU libgomp; LLVM's libomp on macOS)."""
    for name in ("libgomp.so.1", "libomp.dylib", "libomp.so"):
        with contextlib.suppress(OSError):
            return C.CDLL(name)
    pytest.skip("no OpenMP runtime found to set the team size")


# Also on Linux aarch64 under emulation (.ci/aarch64.sh): the portable kernels, threaded.
pytestmark = pytest.mark.aarch64

#: more threads than this machine may have cores: an uneven share of the panels
THREADS = 3


@contextlib.contextmanager
def omp_threads(n: int):
    """The calling thread's OpenMP team size for a scope (the libgomp the shim runs on)."""
    gomp = _openmp()
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(n)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


def reference(op, xv, wv, yv, bv, geo, alpha):
    """The float64 result of op: direct sums over kernel offsets, written out here."""
    N, C, H, W = xv.shape
    K, Cg, kh, kw = wv.shape
    G, (s, p) = geo["groups"], (geo["stride"], geo["pad"])
    Ho, Wo = yv.shape[2:]
    xp = np.zeros((N, C, H + 2 * p, W + 2 * p))
    xp[:, :, p : p + H, p : p + W] = xv
    Kg = K // G
    # cols[n, g, c, i, j, oh, ow]: the input each kernel offset meets at each output position
    cols = np.empty((N, G, Cg, kh, kw, Ho, Wo))
    for i, j in itertools.product(range(kh), range(kw)):
        patch = xp[:, :, i : i + s * (Ho - 1) + 1 : s, j : j + s * (Wo - 1) + 1 : s]
        cols[:, :, :, i, j] = patch.reshape(N, G, Cg, Ho, Wo)
    wg = wv.reshape(G, Kg, Cg, kh, kw)
    if op == FORWARD:
        y = np.einsum("ngcijhw,gkcij->ngkhw", cols, wg).reshape(N, K, Ho, Wo)
        return alpha * (y + (bv[None, :, None, None] if bv is not None else 0))
    dyg = yv.reshape(N, G, Kg, Ho, Wo)
    if op == BACKWARD_WEIGHT:
        return alpha * np.einsum("ngcijhw,ngkhw->gkcij", cols, dyg).reshape(K, Cg, kh, kw)
    dcols = np.einsum("gkcij,ngkhw->ngcijhw", wg, dyg)
    dxp = np.zeros_like(xp)
    for i, j in itertools.product(range(kh), range(kw)):
        view = dxp[:, :, i : i + s * (Ho - 1) + 1 : s, j : j + s * (Wo - 1) + 1 : s]
        view += dcols[:, :, :, i, j].reshape(N, C, Ho, Wo)
    return alpha * dxp[:, :, p : p + H, p : p + W]


def case(
    blas,
    rng,
    op,
    dtype,
    *,
    N,
    C,
    K,
    size,
    k,
    stride=1,
    pad=None,
    groups=1,
    lay="dense",
    algo_id=0,
    limit=None,
    bias=False,
    alpha=1.0,
    beta=0.0,
):
    """One problem run on 1 and THREADS threads: both right, both the same bits. Returns the
    plan's algorithm name."""
    pad = k // 2 if pad is None else pad
    Ho = (size + 2 * pad - k) // stride + 1
    xv = random_input(rng, (N, C, size, size), dtype)
    wv = random_input(rng, (K, C // groups, k, k), dtype)
    yv = random_input(rng, (N, K, Ho, Ho), dtype)
    bv = random_input(rng, (K,), dtype) if bias and op != BACKWARD_DATA else None
    q = {name: values(store_as(v, dtype), dtype) for name, v in (("x", xv), ("w", wv), ("y", yv))}
    bq = values(store_as(bv, dtype), dtype) if bv is not None else None
    geo = dict(stride=stride, pad=pad, groups=groups)
    out_name = {FORWARD: "y", BACKWARD_DATA: "x", BACKWARD_WEIGHT: "w"}[op]
    old = random_input(rng, q[out_name].shape, dtype) if beta else None
    expected = reference(op, q["x"], q["w"], q["y"], bq, geo, alpha)
    if old is not None:
        expected = expected + beta * values(store_as(old, dtype), dtype)
    results, names = [], set()
    for threads in (1, THREADS):
        arrays = {n: layout(store_as(v, dtype), lay) for n, v in (("x", xv), ("w", wv), ("y", yv))}
        b = store_as(bv, dtype) if bv is not None else None
        arrays[out_name][...] = store_as(old if old is not None else np.full(q[out_name].shape, np.nan), dtype)
        if b is not None and op == BACKWARD_WEIGHT:
            b[...] = store_as(np.full(b.shape, np.nan), dtype)
        with omp_threads(threads):
            error, args = run(
                blas,
                op,
                arrays["x"],
                arrays["w"],
                arrays["y"],
                b,
                dtype,
                stride=(stride,) * 2,
                dilation=(1, 1),
                lo=(pad,) * 2,
                hi=(pad,) * 2,
                groups=groups,
                alpha=alpha,
                beta=beta,
                limit=limit,
                policy=ABI.ALGO_GIVEN if algo_id else ABI.ALGO_HEURISTIC,
                algo_id=algo_id,
            )
        assert error is None, error
        out = arrays[out_name]
        check_close(out, expected, dtype, f"{out_name} on {threads} threads ({args.name})")
        if b is not None and op == BACKWARD_WEIGHT:
            db = alpha * q["y"].sum(axis=(0, 2, 3))
            check_close(b, db, dtype, f"bias gradient on {threads} threads")
            out = np.concatenate([np.ascontiguousarray(out).ravel().view(np.uint8), b.view(np.uint8)])
        results.append(np.ascontiguousarray(out).view(np.uint8).copy())
        names.add(args.name)
    assert np.array_equal(results[0], results[1]), f"1 and {THREADS} threads differ ({names})"
    return names.pop()


OPS = {"forward": FORWARD, "backward_data": BACKWARD_DATA, "backward_weight": BACKWARD_WEIGHT}


# Sizes that give each GEMM several panels (>= 2 x 192 columns or rows, >= 4 Mflop each) and
# several chunks in the batch lowerings.
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("algo_id, lay", [(1, "cl"), (2, "dense"), (3, "dense"), (1, "dense")])
def test_lowerings_split_across_threads(blas, rng, op, dtype, algo_id, lay):
    name = case(blas, rng, OPS[op], dtype, N=3, C=48, K=64, size=24, k=3, lay=lay, algo_id=algo_id, bias=True)
    assert ("rows" in name) == (algo_id == 1), name


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_pointwise_split_across_threads(blas, rng, op, dtype, lay):
    """1x1: x itself is the GEMM operand (native dtypes), one GEMM split in panels."""
    case(blas, rng, OPS[op], dtype, N=2, C=64, K=96, size=28, k=1, lay=lay, alpha=0.5, beta=0.75)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_chunks_within_a_workspace_limit(blas, rng, op, lay):
    """A workspace limit of a few chunks: chunks run in order, each split in panels."""
    name = case(blas, rng, OPS[op], "float32", N=2, C=32, K=64, size=32, k=3, stride=1, lay=lay, limit=600_000)
    assert "OpenBLAS" in name


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_depthwise_split_across_threads(blas, rng, op, dtype, lay):
    name = case(blas, rng, OPS[op], dtype, N=3, C=64, K=64, size=20, k=3, stride=2, groups=64, lay=lay, bias=True)
    assert "depthwise" in name


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_winograd_split_across_threads(blas, rng, dtype, lay):
    """Algorithm 5: transforms parallel over channels or tiles, its 16 GEMMs' panels over the
    team; N=3 x 12 x 12 tiles in chunks of at least 256."""
    name = case(blas, rng, FORWARD, dtype, N=3, C=64, K=80, size=23, k=3, lay=lay, algo_id=5, bias=True, beta=0.75)
    assert "Winograd" in name, name


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("lay", ["dense", "cl"])
def test_depthwise_3x3_in_registers_across_threads(blas, rng, dtype, lay):
    """The register-blocked depthwise forward (3x3, stride 1; NC[D]HW every dtype,
    channels-last float32 and float64): padding, bias and beta, 1 and N threads."""
    name = case(blas, rng, FORWARD, dtype, N=3, C=48, K=48, size=19, k=3, groups=48, lay=lay, bias=True, beta=0.5)
    assert "depthwise" in name, name


def test_grouped_strided_split_across_threads(blas, rng):
    case(blas, rng, FORWARD, "float64", N=2, C=64, K=128, size=30, k=3, stride=2, groups=2, bias=True, beta=-1.5)


@pytest.mark.parametrize(
    "dtype,size,channels,lay",
    [
        ("float16", 7, 8, "dense"),
        ("float16", 13, 8, "dense"),
        ("float16", 14, 8, "dense"),
        ("float16", 28, 8, "strided"),
        ("float16", 261, 2, "dense"),
        ("bfloat16", 7, 8, "dense"),
        ("bfloat16", 14, 8, "strided"),
        ("float16", 7, 24, "cl"),
        ("float16", 28, 256, "cl"),
        ("float16", 5, 300, "cl"),
        ("bfloat16", 7, 24, "cl"),
        ("bfloat16", 28, 256, "cl"),
        ("bfloat16", 5, 300, "cl"),
    ],
)
def test_16bit_depthwise_is_its_float32_rounded(blas, rng, dtype, size, channels, lay):
    """16-bit depthwise runs the float32 kernel on the widened input, so its bits are those of
    the shim's own float32 result on the same values, rounded once (to nearest even: NumPy's
    float16, the tests' bfloat16 rounding). NC[D]HW: widths 7, 13 and 14 leave 1-7 elements
    after the 8-wide F16C blocks (the padded tails of widen and narrow); 'strided' is a
    channel that is not one run; 261 x 261 is over the 65536 elements a channel is widened at
    once in (row spans instead). Channels-last ('cl', x and y; the register-blocked forward,
    on AVX-512 CPUs its AVX-512 copy with 16-lane bfloat16 conversions): 24 and 300 channels
    leave 8 and 12 lanes after the 16-lane blocks."""
    shape_x, shape_w = (2, channels, size, size), (channels, 1, 3, 3)
    x16 = store_as(rng.standard_normal(shape_x), dtype)
    w16 = store_as(rng.standard_normal(shape_w) / 3, dtype)
    outs = {}
    for dt in (dtype, "float32"):
        x = layout(x16 if dt == dtype else values(x16, dtype).astype(np.float32), lay)
        w = np.ascontiguousarray(w16 if dt == dtype else values(w16, dtype).astype(np.float32))
        y = layout(store_as(np.full((2, channels, size, size), np.nan), dt), "cl" if lay == "cl" else "dense")
        error, args = run(
            blas, FORWARD, x, w, y, None, dt, stride=(1, 1), dilation=(1, 1), lo=(1, 1), hi=(1, 1),
            groups=channels, alpha=1.0, beta=0.0, limit=None, policy=ABI.ALGO_HEURISTIC, algo_id=0,
        )  # fmt: skip
        assert error is None, error
        assert ("depthwise (channels-last)" if lay == "cl" else "depthwise") in args.name, args.name
        outs[dt] = y
    want = reference(FORWARD, values(x16, dtype), values(w16, dtype), outs["float32"], None,
                     dict(stride=1, pad=1, groups=channels), 1.0)  # fmt: skip
    check_close(outs[dtype], want, dtype, f"{dtype} depthwise")
    rounded = np.ascontiguousarray(store_as(outs["float32"].astype(np.float64), dtype))
    differ = np.ascontiguousarray(outs[dtype]).view(np.uint16) != rounded.view(np.uint16)
    assert not differ.any(), (
        f"{int(differ.sum())} elements differ from float32 rounded, first at {np.argwhere(differ)[0]}"
    )

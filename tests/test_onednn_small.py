"""The oneDNN shim's small-problem path (algorithm 8; plan names "small: ..."), which the
heuristic picks for float32 forward convolutions below 16384 multiply-adds: im2col +
dnnl_sgemm, or, for stride-1 problems where AVX2 runs, the shim's padded-taps kernel. Every
result is compared with a float64 reference written here, on fresh random inputs, with
outputs poisoned (NaN) before the call. The whole file runs once more with oneDNN capped
below AVX2 (test_below_avx2_every_test_here_passes_on_sgemm), so both ways are checked on
any x86-64 machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading

import numpy as np
import pytest

import flux_dnn

PATH = "small: "  # every plan name of the path starts so
TAPS = "small: padded taps"  # the AVX2 kernel's plan name (im2col + sgemm: "small: im2col")
SMALL_MACS = 1 << 14  # the shim's kSmallProblemMacs
CAP_BELOW_AVX2 = "AVX"  # ONEDNN_MAX_CPU_ISA for the capped run


def _onednn_available() -> bool:
    try:
        x, w = np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 1, 1), np.float32)
        return PATH in flux_dnn.conv_plan(x, w, algorithm=8).algorithm
    except Exception:  # noqa: BLE001 - any failure means no usable oneDNN shim here
        return False


pytestmark = pytest.mark.skipif(not _onednn_available(), reason="the oneDNN shim is not usable here")


@pytest.fixture
def rng():
    return np.random.default_rng()


# -- the float64 reference --------------------------------------------------------------------


def reference(
    x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, alpha=1.0, beta=0.0, y0=None, activation=None
):
    """y = alpha * act(conv(x, w) + bias) + beta * y0 in float64, by kernel taps."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    stride = (stride,) * nd if np.isscalar(stride) else tuple(stride)
    dilation = (dilation,) * nd if np.isscalar(dilation) else tuple(dilation)
    pads = (
        [(padding, padding)] * nd if np.isscalar(padding) else [p if isinstance(p, tuple) else (p, p) for p in padding]
    )
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    n, c = x.shape[:2]
    k, cg = w.shape[0], w.shape[1]
    kg = k // groups
    out = [(xp.shape[2 + i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    y = np.zeros((n, k, *out))
    for tap in np.ndindex(*w.shape[2:]):
        window = tuple(
            slice(tap[i] * dilation[i], tap[i] * dilation[i] + stride[i] * (out[i] - 1) + 1, stride[i])
            for i in range(nd)
        )
        xs = xp[(slice(None), slice(None), *window)]
        for g in range(groups):
            wg = w[(slice(g * kg, (g + 1) * kg), slice(None), *tap)]
            y[:, g * kg : (g + 1) * kg] += np.einsum("nc...,kc->nk...", xs[:, g * cg : (g + 1) * cg], wg)
    if bias is not None:
        y += bias.astype(np.float64).reshape((1, k) + (1,) * nd)
    if activation == "relu":
        y = np.maximum(y, 0)
    elif isinstance(activation, tuple) and activation[0] == "leaky_relu":
        y = np.where(y > 0, y, activation[1] * y)
    elif isinstance(activation, tuple) and activation[0] == "clip":
        y = np.minimum(np.maximum(y, activation[1]), activation[2])
    y *= alpha
    if beta != 0:
        y += beta * y0.astype(np.float64)
    return y


def assert_matches(y, expected, reduction):
    """float32 against float64: a relative bound that grows with the reduction length."""
    tol = 1e-5 * max(1.0, np.sqrt(reduction)) * max(1.0, np.abs(expected).max())
    assert y.shape == expected.shape
    assert np.isfinite(y).all(), "NaN or inf in the output (poison leaked?)"
    np.testing.assert_allclose(y, expected, rtol=0, atol=tol)


def channels_last(a):
    """The same array values, stored (N, *spatial, C)."""
    order = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return np.ascontiguousarray(a.transpose(order)).transpose(back)


def macs(x_shape, w_shape, y_shape):
    return y_shape[0] * y_shape[1] * w_shape[1] * int(np.prod(w_shape[2:])) * int(np.prod(y_shape[2:]))


def poisoned(shape, layout="nchw"):
    y = np.full(shape, np.nan, np.float32)
    return channels_last(y) if layout == "channels_last" else y


def draw(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


# -- the path is taken for small problems, not for big ones ------------------------------------


def test_heuristic_takes_the_path_for_the_tiny_convolution(rng):
    x, w = draw(rng, (1, 4, 8, 8)), draw(rng, (4, 4, 3, 3))
    plan = flux_dnn.conv_plan(x, w, padding=1)
    assert PATH in plan.algorithm
    assert_matches(plan(x), reference(x, w, padding=1), 36)


@pytest.mark.parametrize(
    "x_shape, w_shape",
    [((1, 8, 8, 8), (8, 8, 3, 3)), ((1, 16, 16, 16), (16, 16, 3, 3)), ((8, 64, 14, 14), (64, 64, 3, 3))],
)
def test_heuristic_keeps_the_primitive_for_bigger_problems(rng, x_shape, w_shape):
    x, w = draw(rng, x_shape), draw(rng, w_shape)
    plan = flux_dnn.conv_plan(x, w, padding=1)
    assert PATH not in plan.algorithm, plan.algorithm
    assert macs(x_shape, w_shape, plan.output_shape) >= SMALL_MACS


@pytest.mark.parametrize(
    "what, kwargs",
    [
        ("an activation it does not apply", dict(activation="sigmoid")),
        ("an explicit algorithm", dict(algorithm=0)),
        ("the benchmark policy", dict(algorithm="benchmark")),
    ],
)
def test_other_requests_keep_the_primitive(rng, what, kwargs):
    x, w = draw(rng, (1, 4, 8, 8)), draw(rng, (4, 4, 3, 3))
    assert PATH not in flux_dnn.conv_plan(x, w, padding=1, **kwargs).algorithm, what


def test_float16_keeps_the_primitive(rng):
    x, w = draw(rng, (1, 4, 8, 8)).astype(np.float16), draw(rng, (4, 4, 3, 3)).astype(np.float16)
    assert PATH not in flux_dnn.conv_plan(x, w, padding=1).algorithm


def test_algorithm_8_refuses_what_it_cannot_compute(rng):
    """UNSUPPORTED from the oneDNN shim, which the dispatcher passes on to the next CPU shim
    (the BLAS shim, which has no id 8): the call fails, nothing is computed wrongly."""
    x, w = draw(rng, (1, 4, 8, 8)), draw(rng, (4, 4, 3, 3))
    with pytest.raises((flux_dnn.UnsupportedError, ValueError), match=r"algo(rithm|_id) 8"):
        flux_dnn.conv2d(x, w, padding=1, algorithm=8, activation="tanh")


def test_algorithm_9_is_not_an_id_of_the_shim(rng):
    x, w = draw(rng, (1, 4, 8, 8)), draw(rng, (4, 4, 3, 3))
    with pytest.raises(ValueError, match=r"algo_id 9"):
        flux_dnn.conv2d(x, w, padding=1, algorithm=9)


# -- results: every geometry the path takes -----------------------------------------------------

# (name, x shape, w shape, conv keyword arguments); all below SMALL_MACS, so the heuristic
# takes the path (asserted), except where said.
CASES = [
    ("2d", (1, 4, 8, 8), (4, 4, 3, 3), dict(padding=1)),
    ("2d N=3", (3, 3, 5, 5), (4, 3, 3, 3), dict(padding=1)),
    ("2d stride 2", (2, 3, 9, 9), (5, 3, 3, 3), dict(stride=2, padding=1)),
    ("2d stride (1, 3)", (1, 3, 7, 10), (4, 3, 3, 3), dict(stride=(1, 3))),
    ("2d dilation 2", (1, 3, 9, 9), (4, 3, 3, 3), dict(dilation=2, padding=2)),
    ("2d asymmetric padding", (1, 3, 7, 6), (4, 3, 3, 2), dict(padding=((0, 2), (3, 1)))),
    ("2d padding beyond the kernel", (1, 2, 3, 3), (2, 2, 2, 2), dict(padding=((3, 1), (1, 3)))),
    ("2d groups 2", (2, 4, 6, 6), (6, 2, 3, 3), dict(padding=1, groups=2)),
    ("2d depthwise", (2, 6, 7, 7), (6, 1, 3, 3), dict(padding=1, groups=6)),
    ("2d depthwise x2", (1, 4, 6, 6), (8, 1, 3, 3), dict(padding=(1, 0), groups=4, stride=(2, 1))),
    ("2d 1x1", (2, 16, 6, 6), (8, 16, 1, 1), dict()),
    ("2d 1x1 groups", (2, 8, 5, 5), (6, 4, 1, 1), dict(groups=2)),
    ("2d 1x1 strided", (1, 8, 7, 7), (4, 8, 1, 1), dict(stride=2)),
    ("2d 1x1 padded", (1, 8, 5, 5), (4, 8, 1, 1), dict(padding=1)),
    ("2d kernel as big as x", (1, 3, 4, 4), (5, 3, 4, 4), dict()),
    ("1d", (2, 4, 17), (6, 4, 5), dict(padding=2)),
    ("1d stride dilation asym", (1, 3, 20), (4, 3, 3), dict(stride=3, dilation=2, padding=((4, 1),))),
    ("1d 1x1", (3, 8, 9), (5, 8, 1), dict()),
    ("3d", (1, 2, 4, 4, 4), (3, 2, 3, 3, 3), dict(padding=1)),
    (
        "3d stride asym groups",
        (1, 4, 6, 5, 7),
        (4, 2, 2, 3, 2),
        dict(stride=(2, 1, 2), padding=((1, 0), (0, 2), (1, 1)), groups=2),
    ),
    ("3d 1x1", (2, 6, 3, 4, 3), (5, 6, 1, 1, 1), dict()),
]


def _run(x, w, bias, kwargs, out=None, **extra):
    return flux_dnn.conv(x, w, bias, out=out, **kwargs, **extra)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("name, x_shape, w_shape, kwargs", CASES, ids=[c[0] for c in CASES])
def test_matches_the_float64_reference(rng, name, x_shape, w_shape, kwargs, layout):
    x, w, bias = draw(rng, x_shape), draw(rng, w_shape), draw(rng, (w_shape[0],))
    if layout == "channels_last":
        x = channels_last(x)
    expected = reference(x, w, bias, **kwargs)
    plan = flux_dnn.conv_plan(x, w, bias, **kwargs)
    assert macs(x_shape, w_shape, expected.shape) < SMALL_MACS, name  # keeps the table honest
    assert PATH in plan.algorithm, (name, plan.algorithm)
    y = poisoned(expected.shape, layout)
    assert _run(x, w, bias, kwargs, out=y) is y
    assert_matches(y, expected, w_shape[1] * np.prod(w_shape[2:]))
    assert_matches(plan(x), expected, w_shape[1] * np.prod(w_shape[2:]))


@pytest.mark.parametrize("name, x_shape, w_shape, kwargs", CASES, ids=[c[0] for c in CASES])
def test_algorithm_8_without_bias_on_mixed_layouts(rng, name, x_shape, w_shape, kwargs):
    """x channels-last into an NCHW y and the reverse, no bias, the given algorithm id."""
    x, w = channels_last(draw(rng, x_shape)), draw(rng, w_shape)
    expected = reference(x, w, **kwargs)
    y = poisoned(expected.shape, "nchw")
    _run(x, w, None, kwargs, out=y, algorithm=8)
    assert_matches(y, expected, w_shape[1] * np.prod(w_shape[2:]))
    x = np.ascontiguousarray(x)
    y = poisoned(expected.shape, "channels_last")
    _run(x, w, None, kwargs, out=y, algorithm=8)
    assert_matches(y, expected, w_shape[1] * np.prod(w_shape[2:]))


ACTIVATIONS = [None, "relu", ("leaky_relu", 0.2), ("clip", -0.5, 0.75)]


def _epilogue_case(rng, layout, with_bias):
    """x (2, 4, 6, 6) in `layout`, w 4x4x3x3, and a bias or None: fresh random values."""
    x, w = draw(rng, (2, 4, 6, 6)), draw(rng, (4, 4, 3, 3))
    bias = draw(rng, (4,)) if with_bias else None
    return (channels_last(x) if layout == "channels_last" else x), w, bias


EPILOGUE_CASES = pytest.mark.parametrize(
    "layout, activation, with_bias",
    [(layout, act, b) for layout in ("nchw", "channels_last") for act in ACTIVATIONS for b in (False, True)],
    ids=str,
)


@EPILOGUE_CASES
def test_alpha_beta_zero_does_not_read_the_nan_output(rng, layout, activation, with_bias):
    x, w, bias = _epilogue_case(rng, layout, with_bias)
    expected = reference(x, w, bias, padding=1, alpha=0.75, activation=activation)
    y = poisoned(expected.shape, layout)
    plan = flux_dnn.conv_plan(x, w, bias, padding=1, alpha=0.75, activation=activation)
    assert PATH in plan.algorithm
    flux_dnn.conv2d(x, w, bias, padding=1, alpha=0.75, activation=activation, out=y)
    assert_matches(y, expected, 36)


@EPILOGUE_CASES
def test_alpha_beta_accumulates_into_a_prior_output(rng, layout, activation, with_bias):
    x, w, bias = _epilogue_case(rng, layout, with_bias)
    y = poisoned((2, 4, 6, 6), layout)
    y[...] = draw(rng, y.shape)
    expected = reference(x, w, bias, padding=1, alpha=-1.5, beta=0.5, y0=y.copy(), activation=activation)
    flux_dnn.conv2d(x, w, bias, padding=1, alpha=-1.5, beta=0.5, activation=activation, out=y)
    assert_matches(y, expected, 36)


@pytest.mark.parametrize("beta", [0.0, 0.25])
def test_out_views_with_odd_strides(rng, beta):
    """y a view of a larger array (every other channel and column, rows apart): the
    product goes through the workspace and is written through y's strides; the elements of
    the larger array outside the view stay as they were."""
    x, w, bias = draw(rng, (2, 3, 7, 7)), draw(rng, (4, 3, 3, 3)), draw(rng, (4,))
    base = np.full((2, 8, 9, 16), np.nan, np.float32)
    y = base[:, 1::2, 1:8, ::2][..., :7]
    y[...] = draw(rng, y.shape) if beta else np.nan
    before = base.copy()
    expected = reference(x, w, bias, padding=1, alpha=2.0, beta=beta, y0=y.copy())
    assert PATH in flux_dnn.conv_plan(x, w, bias, padding=1, alpha=2.0).algorithm
    flux_dnn.conv2d(x, w, bias, padding=1, alpha=2.0, beta=beta, out=y)
    assert_matches(y, expected, 27)
    outside = np.ones(base.shape, bool)
    outside[:, 1::2, 1:8, ::2][..., :7] = False
    np.testing.assert_array_equal(base[outside], before[outside])


def test_strided_weights_and_broadcast_bias(rng):
    """Weights stored (K, kh, kw, C) and a stride-0 bias: copied / read through strides."""
    x = draw(rng, (1, 4, 6, 6))
    w = channels_last(draw(rng, (5, 4, 3, 3)))
    bias = np.broadcast_to(np.float32(rng.standard_normal()), (5,))
    expected = reference(x, w, bias, padding=1)
    y = poisoned(expected.shape)
    flux_dnn.conv2d(x, w, bias, padding=1, out=y)
    assert PATH in flux_dnn.conv_plan(x, w, bias, padding=1).algorithm
    assert_matches(y, expected, 36)


def test_a_packed_plan_reads_its_own_weights(rng):
    """conv_plan packs the weights: later changes to the caller's w are not seen."""
    x, w, bias = draw(rng, (2, 4, 6, 6)), draw(rng, (6, 2, 3, 3)), draw(rng, (6,))
    plan = flux_dnn.conv_plan(x, w, bias, padding=1, groups=2)
    assert PATH in plan.algorithm and plan.weights_packed, plan.algorithm
    original = w.copy()
    w[...] = np.nan
    for _ in range(2):
        x2 = draw(rng, x.shape)
        assert_matches(plan(x2), reference(x2, original, bias, padding=1, groups=2), 18)


def test_algorithm_8_at_a_size_above_the_serial_bound(rng):
    """Given explicitly, the path runs at any size (sgemm on the OpenMP team there)."""
    x, w, bias = draw(rng, (2, 16, 20, 20)), draw(rng, (24, 16, 3, 3)), draw(rng, (24,))
    expected = reference(x, w, bias, padding=1)
    plan = flux_dnn.conv_plan(x, w, bias, padding=1, algorithm=8)
    assert PATH in plan.algorithm
    y = poisoned(expected.shape)
    plan(x, out=y)
    assert_matches(y, expected, 144)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_one_plan_on_several_threads_at_once(rng, layout):
    """Each thread its own x and y, one plan: per-call workspaces, no shared state."""
    x0, w, bias = draw(rng, (2, 4, 7, 7)), draw(rng, (4, 4, 3, 3)), draw(rng, (4,))
    if layout == "channels_last":
        x0 = channels_last(x0)
    plan = flux_dnn.conv_plan(x0, w, bias, padding=1, activation="relu")
    assert PATH in plan.algorithm
    inputs = [draw(rng, x0.shape) for _ in range(6)]
    if layout == "channels_last":
        inputs = [channels_last(x) for x in inputs]
    expected = [reference(x, w, bias, padding=1, activation="relu") for x in inputs]
    errors = []
    barrier = threading.Barrier(len(inputs))

    def work(i):
        try:
            barrier.wait()
            for _ in range(200):
                y = poisoned(expected[i].shape, layout)
                plan(inputs[i], out=y)
                assert_matches(y, expected[i], 36)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 0.0), (0.5, 0.25)])
def test_the_result_does_not_depend_on_the_output_layout(rng, alpha, beta):
    """NCHW y (sgemm writes it), channels-last y and an odd view (through the workspace): the
    same float32 bits, as out= and a fresh output must agree."""
    x, w, bias = draw(rng, (2, 4, 6, 6)), draw(rng, (4, 4, 3, 3)), draw(rng, (4,))
    prior = draw(rng, (2, 4, 6, 6))
    results = []
    for layout in ("nchw", "channels_last", "view"):
        if layout == "view":
            y = np.empty((2, 4, 6, 12), np.float32)[..., ::2]
        else:
            y = poisoned(prior.shape, layout)
        y[...] = prior
        flux_dnn.conv2d(x, w, bias, padding=1, alpha=alpha, beta=beta, activation="relu" if beta == 0 else None, out=y)
        results.append(np.array(y))
    assert_matches(
        results[0],
        reference(x, w, bias, padding=1, alpha=alpha, beta=beta, y0=prior, activation="relu" if beta == 0 else None),
        36,
    )
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_array_equal(results[2], results[0])


# -- the padded-taps kernel, and the capped instruction set ----------------------------------


def _cpu_features() -> dict:
    """NumPy's run-time CPU feature table ({} where this NumPy does not expose it)."""
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return dict(__import__(module, fromlist=["_"]).__cpu_features__)
        except (ImportError, AttributeError):
            continue
    return {}


def _taps_expected() -> bool | None:
    """Whether stride-1 problems should take the padded-taps kernel here: x86-64 with AVX2
    and FMA, oneDNN not capped below AVX2; None where the CPU's features cannot be told."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("SSE41", "AVX"):
        return False
    features = _cpu_features()
    if "AVX2" not in features or "FMA3" not in features:
        return None
    return bool(features["AVX2"] and features["FMA3"])


def test_stride_1_problems_take_the_taps_kernel_where_avx2_runs(rng):
    """The tiny convolution's plan name says which way it is computed: the taps kernel on an
    AVX2 + FMA machine, im2col + sgemm below (the capped run of this file checks that)."""
    expected = _taps_expected()
    if expected is None:
        pytest.skip("cannot tell whether this CPU has AVX2 and FMA (no NumPy CPU feature table)")
    x, w = draw(rng, (1, 4, 8, 8)), draw(rng, (4, 4, 3, 3))
    name = flux_dnn.conv_plan(x, w, padding=1).algorithm
    assert name.startswith(TAPS if expected else "small: im2col"), name


# (out channels per group, output width): the kernel's register blocks are 4 rows by 16
# columns, then 8 columns, then a masked tail; 1 to 9 rows and widths whose wide rows leave
# every remainder of 16 and 8.
TAP_BLOCKS = [(k, width) for k in (1, 2, 3, 4, 5, 7, 9) for width in (1, 5, 6, 7, 12)]


@pytest.mark.parametrize("out_per_group, width", TAP_BLOCKS)
@pytest.mark.parametrize("dilation, groups", [(1, 1), (2, 1), (1, 2)])
def test_every_register_block_of_the_taps_kernel(rng, out_per_group, width, dilation, groups):
    """Stride-1 2-D problems of every block shape, through a plan (fresh output) and out=
    (poisoned), with bias, alpha and an activation, against the float64 reference."""
    c = 2 * groups
    x = draw(rng, (1, c, 3, width))
    w = draw(rng, (out_per_group * groups, 2, 3, 3))
    bias = draw(rng, (out_per_group * groups,))
    kwargs = dict(padding=dilation, dilation=dilation, groups=groups)
    expected = reference(x, w, bias, alpha=0.75, activation="relu", **kwargs)
    plan = flux_dnn.conv_plan(x, w, bias, alpha=0.75, activation="relu", algorithm=8, **kwargs)
    assert PATH in plan.algorithm, plan.algorithm
    assert_matches(plan(x), expected, 18)
    y = poisoned(expected.shape)
    flux_dnn.conv2d(x, w, bias, alpha=0.75, activation="relu", algorithm=8, out=y, **kwargs)
    assert_matches(y, expected, 18)


@pytest.mark.parametrize(
    "x_shape, w_shape, kwargs",
    [
        ((2, 3, 19), (5, 3, 4), dict(padding=((2, 1),), dilation=2)),
        ((1, 2, 1, 6, 9), (3, 2, 1, 3, 2), dict(padding=(0, 1, 0))),
        ((1, 2, 3, 6, 9), (3, 2, 3, 3, 2), dict(padding=(0, 1, 0), dilation=(1, 2, 1))),
        ((3, 5, 4, 4), (2, 5, 4, 4), dict(padding=((3, 0), (0, 3)))),
    ],
    ids=["1d dilation", "3d one output plane", "3d dilated plane", "2d padding on one side"],
)
def test_the_taps_kernel_on_other_ranks_and_paddings(rng, x_shape, w_shape, kwargs):
    x, w = draw(rng, x_shape), draw(rng, w_shape)
    expected = reference(x, w, **kwargs)
    y = poisoned(expected.shape)
    flux_dnn.conv(x, w, algorithm=8, out=y, **kwargs)
    assert_matches(y, expected, w_shape[1] * np.prod(w_shape[2:]))
    assert_matches(flux_dnn.conv_plan(x, w, algorithm=8, **kwargs)(x), expected, w_shape[1] * np.prod(w_shape[2:]))


def test_below_avx2_every_test_here_passes_on_sgemm():
    """oneDNN capped below AVX2 (ONEDNN_MAX_CPU_ISA=AVX, as on an x86-64 CPU without it): the
    path runs its baseline copies and dnnl_sgemm instead of the AVX2 kernels, and every other
    test of this file, run in a fresh process, passes there."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"ONEDNN_MAX_CPU_ISA caps x86-64 CPUs, not {platform.machine()}")
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        pytest.skip("this process already runs under ONEDNN_MAX_CPU_ISA (the capped run itself)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": CAP_BELOW_AVX2}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=env, cwd=os.path.dirname(__file__)
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]

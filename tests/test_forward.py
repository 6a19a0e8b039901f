"""Forward convolution on NumPy arrays through the oneDNN shim, against the float64 reference."""

import numpy as np
import pytest

import flux_dnn
import reference as ref
from conftest import require_onednn


def draw_config(rng, nd):
    """A random convolution: strides, dilations, groups (depthwise too), asymmetric padding,
    odd sizes, batch 1 and larger."""
    groups = int(rng.choice([1, 1, 2, 3]))
    depthwise = rng.random() < 0.2
    cg = 1 if depthwise else int(rng.integers(1, 4))
    kg = 1 if depthwise else int(rng.integers(1, 4))
    C, K = cg * groups, kg * groups
    kernel = tuple(int(v) for v in rng.integers(1, 4, nd))
    stride = tuple(int(v) for v in rng.integers(1, 3, nd))
    dilation = tuple(int(v) for v in rng.integers(1, 3, nd))
    lo = tuple(int(v) for v in rng.integers(0, 3, nd))
    hi = tuple(int(v) for v in rng.integers(0, 3, nd))
    size = 7 if nd == 3 else 11
    spatial = tuple(int(max(v, d * (k - 1) + 1)) for v, d, k in zip(rng.integers(3, size, nd), dilation, kernel))
    N = int(rng.choice([1, 2, 3]))
    return dict(
        N=N, C=C, K=K, groups=groups, kernel=kernel, stride=stride, dilation=dilation, lo=lo, hi=hi, spatial=spatial
    )


def tolerance(expected):
    return dict(rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("case", range(12))
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_forward_matches_reference(rng, nd, case, layout):
    c = draw_config(rng, nd)
    x = rng.standard_normal((c["N"], c["C"], *c["spatial"]), dtype=np.float32)
    w = rng.standard_normal((c["K"], c["C"] // c["groups"], *c["kernel"]), dtype=np.float32)
    b = rng.standard_normal(c["K"], dtype=np.float32) if rng.random() < 0.5 else None
    if layout == "channels_last":
        x = ref.channels_last(x)
    expected = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    out = ref.poisoned_like(expected.shape, np.float32, layout == "channels_last")
    padding = tuple(zip(c["lo"], c["hi"]))
    result = flux_dnn.conv(x, w, b, c["stride"], padding, c["dilation"], c["groups"], out=out)
    assert result is out
    assert not np.isnan(out).any(), f"unwritten output elements for {c}"
    np.testing.assert_allclose(out, expected, **tolerance(expected), err_msg=str(c))
    # Without out=, the result is a new NumPy array in x's memory format.
    fresh = flux_dnn.conv(x, w, b, c["stride"], padding, c["dilation"], c["groups"])
    assert isinstance(fresh, np.ndarray) and fresh.dtype == np.float32
    if x.flags.c_contiguous:  # contiguous (also when channels-last strides are ambiguous)
        assert fresh.flags.c_contiguous
    else:
        assert np.moveaxis(fresh, 1, -1).flags.c_contiguous, "channels-last in, channels-last out"
    np.testing.assert_array_equal(fresh, out)


@pytest.mark.parametrize(
    "padding,lo,hi",
    [
        (0, (0, 0), (0, 0)),
        (2, (2, 2), (2, 2)),
        ((1, 3), (1, 3), (1, 3)),
        (((0, 2), (3, 1)), (0, 3), (2, 1)),
        ("valid", (0, 0), (0, 0)),
    ],
)
def test_padding_forms(rng, padding, lo, hi):
    x = rng.standard_normal((2, 4, 9, 10), dtype=np.float32)
    w = rng.standard_normal((5, 4, 3, 2), dtype=np.float32)
    expected = ref.conv_forward(x, w, None, (1, 1), lo, hi)
    np.testing.assert_allclose(flux_dnn.conv2d(x, w, padding=padding), expected, **tolerance(expected))


@pytest.mark.parametrize("kernel,dilation", [((3, 3), (1, 1)), ((4, 2), (1, 1)), ((3, 2), (2, 3))])
def test_padding_same_keeps_size(rng, kernel, dilation):
    x = rng.standard_normal((1, 3, 8, 7), dtype=np.float32)
    w = rng.standard_normal((2, 3, *kernel), dtype=np.float32)
    total = [d * (k - 1) for d, k in zip(dilation, kernel)]
    lo = tuple(t // 2 for t in total)
    hi = tuple(t - low for t, low in zip(total, lo))
    expected = ref.conv_forward(x, w, None, (1, 1), lo, hi, dilation)
    y = flux_dnn.conv2d(x, w, padding="same", dilation=dilation)
    assert y.shape == x.shape[:1] + (2,) + x.shape[2:]
    np.testing.assert_allclose(y, expected, **tolerance(expected))


def test_resnet_sized_layer(rng):
    x = rng.standard_normal((2, 64, 28, 28), dtype=np.float32)
    w = rng.standard_normal((128, 64, 3, 3), dtype=np.float32) * 0.1
    b = rng.standard_normal(128, dtype=np.float32)
    expected = ref.conv_forward(x, w, b, (2, 2), (1, 1), (1, 1))
    for layout in (x, ref.channels_last(x)):
        np.testing.assert_allclose(flux_dnn.conv2d(layout, w, b, stride=2, padding=1), expected, **tolerance(expected))


def test_empty_batch_returns_empty(rng):
    x = np.zeros((0, 3, 5, 5), np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    assert flux_dnn.conv2d(x, w).shape == (0, 4, 3, 3)


def test_plan_cache_hits_and_capacity(rng):
    flux_dnn.set_plan_cache_capacity(512)
    x = rng.standard_normal((1, 2, 6, 6), dtype=np.float32)
    w = rng.standard_normal((3, 2, 3, 3), dtype=np.float32)
    flux_dnn.conv2d(x, w)
    before = flux_dnn.plan_cache_info()
    for _ in range(5):
        flux_dnn.conv2d(x, w)
    after = flux_dnn.plan_cache_info()
    assert after["hits"] == before["hits"] + 5 and after["misses"] == before["misses"]
    try:
        flux_dnn.set_plan_cache_capacity(1)
        flux_dnn.conv2d(x, w, padding=1)
        info = flux_dnn.plan_cache_info()
        assert info["size"] == 1 and info["capacity"] == 1 and info["evictions"] > before["evictions"]
        flux_dnn.set_plan_cache_capacity(0)  # caching off still computes correctly
        expected = ref.conv_forward(x, w, None, (1, 1), (2, 2), (2, 2))
        np.testing.assert_allclose(flux_dnn.conv2d(x, w, padding=2), expected, **tolerance(expected))
        assert flux_dnn.plan_cache_info()["size"] == 0
    finally:
        flux_dnn.set_plan_cache_capacity(512)


def test_same_call_from_threads(rng):
    """One cached plan executed by several threads at once (the workspace is per thread)."""
    from concurrent.futures import ThreadPoolExecutor

    x = rng.standard_normal((4, 8, 16, 16), dtype=np.float32)
    w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: flux_dnn.conv2d(x, w, padding=1), range(16)))
    for y in results:
        np.testing.assert_allclose(y, expected, **tolerance(expected))


def test_workspace_refused_falls_back_with_one_warning(rng):
    """When the array library's allocator refuses the workspace (GPU shims get it from CuPy's
    or torch's allocator), the core switches to a plan that needs none and warns once. The
    CPU shim normally uses the core's own buffer; driving the allocator path with it checks
    the core's plumbing, not any GPU."""
    from flux_dnn import _conv, _core

    require_onednn()
    x = rng.standard_normal((2, 16, 8, 8), dtype=np.float32)
    w = rng.standard_normal((8, 16, 1, 1), dtype=np.float32)
    expected = ref.conv_forward(x, w)
    flux_dnn.conv2d(x, w, algorithm=2)  # oneDNN's blocked layouts: staging buffers in the workspace
    prepared = next(
        p
        for p in _conv._memo.values()
        if getattr(p, "problem", None) and p.problem.options.algorithm == 2 and p.out_shape == expected.shape
    )
    y = np.empty_like(expected, np.float32)
    assert _core.plan_info(prepared.shim, prepared.spec, x, w, y, None)["workspace_size"] > 0
    calls = []

    def refuse(nbytes):
        calls.append(nbytes)
        raise MemoryError(f"cap reached: {nbytes} bytes")

    y = np.full(expected.shape, np.nan, np.float32)
    with pytest.warns(RuntimeWarning, match=r"refused \d+ bytes of convolution workspace \(cap reached"):
        _core.run_conv(prepared.shim, prepared.spec, x, w, y, None, None, refuse)
    assert len(calls) == 1  # refused once; the plan that ran needed no workspace: it asked no more
    np.testing.assert_allclose(y, expected, **tolerance(expected))


@pytest.mark.parametrize("op", ["conv", "conv_transpose"])
@pytest.mark.parametrize("output_padding", [0, 1])
def test_repeated_calls_are_remembered(rng, monkeypatch, op, output_padding):
    """A repeated call (same shapes, dtypes, layouts and arguments) skips every check: it is
    remembered, conv_transpose like conv (output_padding=1 with dilation 2 and no padding
    leaves a last row that no window reaches, which the remembered call must zero again)."""
    from flux_dnn import _conv

    x = rng.standard_normal((2, 4, 5, 6), dtype=np.float32)
    w = rng.standard_normal((3, 4, 3, 2) if op == "conv" else (4, 3, 3, 2), dtype=np.float32)
    b = rng.standard_normal(3, dtype=np.float32)
    if op == "conv":
        call = lambda x, out: flux_dnn.conv2d(x, w, b, 1, 0, 2, out=out)  # noqa: E731
        reference = lambda x: ref.conv_forward(x, w, b, (1, 1), (0, 0), (0, 0), (2, 2))  # noqa: E731
        slow_path = "_new_forward"
    else:
        call = lambda x, out: flux_dnn.conv_transpose2d(x, w, b, 1, 0, output_padding, 1, 2, out=out)  # noqa: E731
        reference = lambda x: ref.conv_transpose(x, w, b, (1, 1), (0, 0), (output_padding,) * 2, (2, 2))  # noqa: E731
        slow_path = "_new_transpose"
    expected = reference(x)
    np.testing.assert_allclose(call(x, None), expected, **tolerance(expected))

    def checked_again(*args):
        raise AssertionError("a repeated call was checked again")

    monkeypatch.setattr(_conv, slow_path, checked_again)
    for _ in range(2):
        fresh = rng.standard_normal(x.shape, dtype=np.float32)
        expected = reference(fresh)
        out = ref.poisoned_like(expected.shape, np.float32)
        assert call(fresh, out) is out
        np.testing.assert_allclose(out, expected, **tolerance(expected))
        np.testing.assert_allclose(call(fresh, None), expected, **tolerance(expected))

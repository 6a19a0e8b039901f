"""Defects of flux_dnn itself (not of a shim) that the conformance suite found, one strict
xfail test each, on the default dispatch. The random draws of the suite keep clear of them
(problems.KNOWN_DEFECTS). When one is fixed its test passes, which fails the run (strict):
then delete the mark here and the avoidance in problems.py, and the test stays here as the
check that the defect does not come back."""

import numpy as np
import pytest

import flux_dnn
import reference as ref

from .libraries import on_cpu


def test_transposed_jax_output_padding_beyond_stride(rng):
    """Rows that output_padding adds beyond every window are zeros, also for a library whose
    slices are copies (JAX): _conv.transpose used to write them in place."""
    jax = pytest.importorskip("jax")
    x = rng.integers(-4, 5, (1, 2, 4, 4)) / 4
    w = rng.integers(-4, 5, (2, 3, 3, 3)) / 4
    # output_padding 1 with stride 1 is allowed because it is below the dilation 2
    expected = ref.conv_transpose(x, w, None, (1, 1), (0, 0), (1, 1), (2, 2))
    y = flux_dnn.conv_transpose(
        jax.numpy.asarray(x, np.float32), jax.numpy.asarray(w, np.float32), stride=1, output_padding=1, dilation=2
    )
    np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=2e-4, atol=2e-4)


def _odd_strides(lib, a, size_one_stride: int):
    """An array of a's values and layout (a NumPy array) in library lib whose size-1 dims
    have stride size_one_stride: the same layout, which NumPy and torch may well hand over
    (np.ascontiguousarray keeps a source's strides of size-1 dims)."""
    strides = [size_one_stride if n == 1 else s // a.itemsize for n, s in zip(a.shape, a.strides)]
    if lib == "torch":
        torch = pytest.importorskip("torch")
        t = torch.empty_strided(a.shape, strides, dtype=torch.float32)
        t.copy_(torch.from_numpy(a))
        return t
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    base = np.empty(span + size_one_stride, np.float32)
    view = np.lib.stride_tricks.as_strided(base, a.shape, [s * 4 for s in strides])
    view[...] = a
    return view


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_plan_takes_arrays_whose_size_one_dims_have_other_strides(rng, lib):
    """A plan compares layouts as the ABI does: the strides of dims of size 1 never matter
    (they reach no element). Here the batch and the one output channel are the size-1 dims,
    planned with one stride and called with others, and the other way round."""
    x = ref.channels_last(rng.integers(-4, 5, (1, 3, 5, 6)) / 4).astype(np.float32)
    w = (rng.integers(-4, 5, (1, 3, 3, 3)) / 4).astype(np.float32)  # one output channel
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    out = ref.poisoned_like((1, 1, 5, 6), np.float32, channels_last_layout=True)
    to_numpy = (lambda a: a.numpy()) if lib == "torch" else np.asarray
    for planned_stride, called_stride in ((1, 7), (13, 1), (5, 11)):
        xs = [_odd_strides(lib, x, s) for s in (planned_stride, called_stride)]
        outs = [_odd_strides(lib, out, s) for s in (planned_stride, called_stride)]
        assert xs[0].stride() != xs[1].stride() if lib == "torch" else xs[0].strides != xs[1].strides
        plan = flux_dnn.conv_plan(xs[0], _odd_strides(lib, w, planned_stride), padding=1)
        for x_in, y_out in ((xs[0], outs[1]), (xs[1], outs[0]), (xs[1], outs[1])):
            y_out[...] = float("nan")
            assert plan(x_in, out=y_out) is y_out
            np.testing.assert_allclose(to_numpy(y_out), expected, rtol=2e-4, atol=2e-4)
            np.testing.assert_allclose(to_numpy(plan(x_in)), expected, rtol=2e-4, atol=2e-4)


def test_plan_still_refuses_another_layout(rng):
    """What a plan does refuse: strides of a dim longer than 1 that differ."""
    x = (rng.integers(-4, 5, (2, 3, 5, 6)) / 4).astype(np.float32)
    w = (rng.integers(-4, 5, (1, 3, 3, 3)) / 4).astype(np.float32)
    plan = flux_dnn.conv_plan(x, w, padding=1)
    out = np.full((2, 1, 6, 5), np.nan, np.float32).transpose(0, 1, 3, 2)  # H, W strides swapped
    with pytest.raises(ValueError, match=r"out: does not fit this convolution plan: strides"):
        plan(x, out=out)


_STRIDED_1X1_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np, flux_dnn
import reference as ref
rng = np.random.default_rng({seed})
# (N, K, spatial, stride): shapes on which oneDNN 3.2 picks its jit_1x1 kernel, from 1 input
# channel to past both vector blocks (8 on AVX2, 16 on AVX-512).
geometries = [(3, 2, (9, 10), (1, 2)), (3, 16, (9, 10), (3, 1)), (8, 8, (300,), (2,)),
              (2, 8, (5, 9, 10), (1, 1, 2))]
ran = set()
for n, k, spatial, stride in geometries:
    for c in (1, 2, 3, 5, 7, 8, 12, 15, 17):
        x = rng.integers(-4, 5, (n, c, *spatial)) / 4
        out_spatial = tuple((s - 1) // st + 1 for s, st in zip(spatial, stride))
        dy = rng.integers(-4, 5, (n, k, *out_spatial)) / 4
        w_shape = (k, c) + (1,) * len(spatial)
        expected = ref.conv_backward_weight(x, dy, w_shape, stride)
        for dtype, algorithms, tol in ((np.float32, ["heuristic", "benchmark", *range(8)], 2e-4),
                                       (np.float16, ["heuristic", 1, 5], 2e-3)):
            xs, dys = ref.channels_last(x.astype(dtype)), ref.channels_last(dy.astype(dtype))
            for algorithm in algorithms:
                for _ in range(3):
                    try:
                        dw = flux_dnn.conv_backward_weight(xs, dys, w_shape, stride=stride, algorithm=algorithm)
                    except (ValueError, flux_dnn.UnsupportedError):
                        assert isinstance(algorithm, int), algorithm  # an id this shim does not have
                        break
                    ran.add(algorithm)
                    np.testing.assert_allclose(dw.astype(np.float64), expected, rtol=tol,
                                               atol=tol * np.abs(expected).max(),
                                               err_msg=f"C={{c}} {{spatial}} stride {{stride}} {{dtype.__name__}} "
                                                       f"algorithm {{algorithm!r}}")
print("ok", sorted(ran, key=str))
"""


@pytest.mark.matrix(libraries="first", where=on_cpu)
def test_strided_1x1_channels_last_weight_gradient(backend, rng):
    """The weight gradient of a 1x1 kernel with a stride on channels-last data with few
    channels, over channel counts, strides, ranks 1 to 3, float32 and float16, and the
    heuristic, benchmark and every algorithm id the shim has: oneDNN 3.2's jit_1x1 kernel for
    it writes past its scratch buffer (oneDNN issue 6035, open), so the oneDNN shim must
    never pick it there. In a process of its own, since heap corruption can kill it, and
    with glibc's heap checks on, so that it dies at the first bad write it can see."""
    import os
    import subprocess
    import sys

    backend.require("backward_weight", "float32", 2, layout="channels_last")
    code = _STRIDED_1X1_SCRIPT.format(tests=os.path.dirname(os.path.dirname(__file__)), seed=int(rng.integers(1 << 62)))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FLUX_DNN_SHIMS": backend.selector, "MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165"},
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), (done.returncode, done.stderr[-2000:])
    assert "'heuristic'" in done.stdout and "'benchmark'" in done.stdout, done.stdout

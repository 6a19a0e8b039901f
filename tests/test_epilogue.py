"""The epilogue through the public API (issue 23), on the CPU shim that serves float32 here:

  - the issue's repro: conv_backward_data(..., alpha=0.5, algorithm="benchmark") was off by
    up to 14 and different on every run (oneDNN shim: a timed candidate's alpha read from
    freed memory); now 0.5 * the float64 gradient, as the heuristic gives;
  - out = alpha * act(conv + bias) + beta * out, the README's meaning, with activations that
    do not commute with scaling.

Fresh random inputs per run (the `rng` fixture prints the seed), outputs poisoned with NaN
before the call, float64 references computed here."""

from __future__ import annotations

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _core


@pytest.fixture
def fresh_autotune(tmp_path):
    """An empty autotune store and plan cache, so that algorithm="benchmark" times candidates
    in this test instead of reusing a choice remembered on disk or in memory."""
    saved = _core.autotune_path()
    _core.set_autotune_path(str(tmp_path / "autotune.txt"))
    flux_dnn.clear_plan_cache()
    yield
    _core.set_autotune_path(saved)
    flux_dnn.clear_plan_cache()


def _close(got, expected, rtol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    assert not np.isnan(got).any(), "unwritten (NaN) elements"
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * max(1.0, np.abs(expected).max()))


@pytest.mark.parametrize("algorithm", ["heuristic", "benchmark"])
@pytest.mark.parametrize("alpha, beta", [(0.5, 0.0), (-1.5, 0.0), (0.5, 1.0)])
def test_backward_data_with_alpha_is_exact_under_every_policy(rng, fresh_autotune, algorithm, alpha, beta):
    """The issue's problem: dy (2, 6, 10, 10), w (6, 8, 3, 3), padding 1, float32."""
    dy = rng.standard_normal((2, 6, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    old = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    expected = alpha * ref.conv_backward_data(dy, w, (2, 8, 10, 10), lo=(1, 1), hi=(1, 1)) + beta * old
    for _run in range(2):  # the first run times candidates, the second reuses the choice
        out = old.copy() if beta else np.full(old.shape, np.nan, np.float32)
        result = flux_dnn.conv_backward_data(
            dy, w, (2, 8, 10, 10), padding=1, alpha=alpha, beta=beta, out=out, algorithm=algorithm
        )
        assert result is out
        _close(out, expected)


@pytest.mark.parametrize("alpha", [0.5, -1.5])
def test_backward_weight_and_transposed_with_alpha_under_benchmark(rng, fresh_autotune, alpha):
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    dy = rng.standard_normal((2, 6, 10, 10)).astype(np.float32)
    dw = np.full((6, 8, 3, 3), np.nan, np.float32)
    flux_dnn.conv_backward_weight(x, dy, (6, 8, 3, 3), padding=1, alpha=alpha, out=dw, algorithm="benchmark")
    _close(dw, alpha * ref.conv_backward_weight(x, dy, (6, 8, 3, 3), lo=(1, 1), hi=(1, 1)))
    wt = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)  # (C_in, C_out, k, k)
    y = np.full((2, 8, 10, 10), np.nan, np.float32)
    flux_dnn.conv_transpose2d(dy, wt, padding=1, alpha=alpha, out=y, algorithm="benchmark")
    _close(y, alpha * ref.conv_transpose(dy, wt, None, (1, 1), (1, 1), (0, 0), (1, 1)))


# ---------------------------------------------------------------------------------------------
# out = alpha * act(conv + bias) + beta * out


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "relu"])
@pytest.mark.parametrize("alpha, beta", [(-1.5, 0.0), (0.5, 0.0), (-0.75, 1.0), (0.25, 1.0)])
@pytest.mark.parametrize("algorithm", ["heuristic", "benchmark"])
def test_alpha_scales_the_activated_result(rng, fresh_autotune, activation, alpha, beta, algorithm):
    """conv2d(..., activation=a, alpha, beta, out) is alpha * a(conv + bias) + beta * out."""
    x = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    old = rng.standard_normal((2, 5, 7, 7)).astype(np.float32)
    out = old.copy() if beta else np.full(old.shape, np.nan, np.float32)
    conv = ref.conv_forward(x, w, b, lo=(1, 1), hi=(1, 1))
    expected = alpha * ref.activate(conv, activation) + beta * old
    flux_dnn.conv2d(x, w, b, padding=1, activation=activation, alpha=alpha, beta=beta, out=out, algorithm=algorithm)
    _close(out, expected)


def test_the_documented_example_of_the_issue(rng):
    """activation="sigmoid", alpha=0.5: 0.5 * sigmoid(v), not sigmoid(0.5 * v)."""
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    y = flux_dnn.conv2d(x, w, activation="sigmoid", alpha=0.5)
    v = ref.conv_forward(x, w)
    _close(y, 0.5 / (1 + np.exp(-v)))
    assert np.asarray(y).max() <= 0.5

"""flux_dnn.conv_plan: a reusable forward convolution with weights packed once."""

import numpy as np
import pytest

import flux_dnn
import reference as ref


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_plan_matches_reference_on_new_inputs(rng, nd, layout):
    spatial = (9, 8, 7)[:nd]
    x = rng.standard_normal((2, 6, *spatial), dtype=np.float32)
    w = rng.standard_normal((8, 3, *([3] * nd)), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    if layout == "channels_last":
        x = ref.channels_last(x)
    plan = flux_dnn.conv_plan(x, w, b, stride=2, padding=1, groups=2, activation="relu")
    assert plan.weights_packed and "packed weights" in plan.algorithm
    w_before = w.copy()
    for _ in range(3):
        fresh = rng.standard_normal(x.shape, dtype=np.float32)
        fresh = ref.channels_last(fresh) if layout == "channels_last" else fresh
        expected = np.maximum(ref.conv_forward(fresh, w, b, (2,) * nd, (1,) * nd, (1,) * nd, None, 2), 0)
        out = ref.poisoned_like(plan.output_shape, np.float32, layout == "channels_last")
        assert plan(fresh, out=out) is out and not np.isnan(out).any()
        np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
        np.testing.assert_allclose(plan(fresh), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    np.testing.assert_array_equal(w, w_before)


def test_plan_keeps_the_packed_weights(rng):
    x = rng.standard_normal((1, 4, 6, 6), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    plan = flux_dnn.conv_plan(x, w)
    expected = ref.conv_forward(x, w)
    w[...] = 0  # the plan holds its own copy
    np.testing.assert_allclose(plan(x), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


def test_plan_rejects_other_inputs(rng):
    x = rng.standard_normal((2, 4, 6, 6), dtype=np.float32)
    w = rng.standard_normal((5, 4, 3, 3), dtype=np.float32)
    plan = flux_dnn.conv_plan(x, w, padding=1)
    with pytest.raises(
        ValueError,
        match=r"x: does not fit this convolution plan: shape \(3, 4, 6, 6\) is not the planned \(2, 4, 6, 6\)",
    ):
        plan(np.zeros((3, 4, 6, 6), np.float32))
    with pytest.raises(TypeError, match=r"x: does not fit this convolution plan: its dtype"):
        plan(x.astype(np.float16))
    with pytest.raises(
        ValueError, match=r"x: does not fit this convolution plan: strides .* are not the planned layout"
    ):
        plan(ref.channels_last(x))
    with pytest.raises(TypeError, match=r"x: this plan was made for numpy.ndarray arrays, got builtins.list"):
        plan([1.0])
    out = np.full((2, 5, 5, 5), 3.0, np.float32)
    with pytest.raises(ValueError, match=r"out: does not fit this convolution plan: shape \(2, 5, 5, 5\)"):
        plan(x, out=out)
    assert (out == 3.0).all()
    with pytest.raises(ValueError, match=r"stride: every value must be >= 1"):
        flux_dnn.conv_plan(x, w, stride=0)


def test_plan_on_torch_tensors_with_bias(rng):
    torch = pytest.importorskip("torch", reason="torch tensors")
    x = rng.standard_normal((2, 3, 7, 7), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    plan = flux_dnn.conv_plan(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1)
    for _ in range(3):  # the bias is handed over anew on every call
        fresh = rng.standard_normal(x.shape, dtype=np.float32)
        y = plan(torch.from_numpy(fresh))
        assert isinstance(y, torch.Tensor)
        expected = ref.conv_forward(fresh, w, b, (1, 1), (1, 1), (1, 1))
        np.testing.assert_allclose(y.numpy(), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())

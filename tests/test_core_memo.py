"""The core's memo of forward call patterns (_core.remembered_forward): conv/conv1d/2d/3d
without keyword options on NumPy arrays, and on torch CPU tensors through DLPack's exchange
API, are answered by the core from the second call of a pattern on. Each test compares with
the float64 reference on fresh inputs, so that a pattern answered with the wrong plan, layout
or output shows."""

import threading

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _conv, _core


@pytest.fixture(autouse=True)
def empty_memos():
    _conv._memo.clear()
    yield
    _conv._memo.clear()


def close(actual, expected, rtol=2e-4):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, np.abs(expected).max()))


def fresh(rng, shape, dtype=np.float32, channels_last=False):
    a = rng.standard_normal(shape).astype(dtype)
    return ref.channels_last(a) if channels_last else a


CASES = {
    # name: (nd, x shape, w shape, bias, keyword geometry)
    "1d stride": (1, (2, 4, 11), (6, 4, 3), True, dict(stride=2, padding=1)),
    "2d tiny": (2, (1, 4, 8, 8), (4, 4, 3, 3), False, dict(padding=1)),
    "2d tuples": (2, (2, 6, 9, 7), (4, 3, 3, 2), True, dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    "2d per-side padding": (2, (1, 3, 7, 7), (5, 3, 3, 3), True, dict(padding=((2, 0), (0, 1)))),
    "3d": (3, (1, 2, 5, 6, 4), (3, 2, 2, 3, 2), False, dict(padding=1)),
}


def expected_of(x, w, b, nd, stride=1, padding=0, dilation=1, groups=1):
    per_dim = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)  # noqa: E731
    if isinstance(padding, tuple) and isinstance(padding[0], tuple):
        lo, hi = tuple(p[0] for p in padding), tuple(p[1] for p in padding)
    else:
        lo = hi = per_dim(padding)
    return ref.conv_forward(x, w, b, per_dim(stride), lo, hi, per_dim(dilation), groups)


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_repeated_pattern_is_answered_by_the_core(rng, case, channels_last):
    nd, x_shape, w_shape, with_bias, geometry = CASES[case]
    conv = {1: flux_dnn.conv1d, 2: flux_dnn.conv2d, 3: flux_dnn.conv3d}[nd]
    w = fresh(rng, w_shape)
    b = fresh(rng, (w_shape[0],)) if with_bias else None
    first = conv(fresh(rng, x_shape, channels_last=channels_last), w, b, **geometry)
    assert _core.remembered_forward_count() == 1
    for _ in range(3):  # new data in the same pattern: the core's answer must follow it
        x = fresh(rng, x_shape, channels_last=channels_last)
        y = conv(x, w, b, **geometry)
        assert y is not first and y.dtype == x.dtype and y.strides == first.strides
        close(y, expected_of(x, w, b, nd, **geometry))
    assert _core.remembered_forward_count() == 1
    x = fresh(rng, x_shape, channels_last=channels_last)
    close(flux_dnn.conv(x, w, b, **geometry), expected_of(x, w, b, nd, **geometry))  # conv() too


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_dtypes_are_remembered_with_their_own_shim(rng, dtype):
    x, w = fresh(rng, (1, 3, 6, 6), dtype), fresh(rng, (2, 3, 3, 3), dtype)
    flux_dnn.conv2d(x, w, padding=1)
    assert _core.remembered_forward_count() == 1
    x = fresh(rng, (1, 3, 6, 6), dtype)
    y = flux_dnn.conv2d(x, w, padding=1)
    assert y.dtype == np.dtype(dtype)
    close(y.astype(np.float64), expected_of(x, w, None, 2, padding=1), rtol=1e-2 if dtype == "float16" else 1e-10)


def test_patterns_the_core_does_not_hold_take_the_python_path(rng):
    x, w = fresh(rng, (1, 2, 6, 6)), fresh(rng, (3, 2, 3, 3))
    expected = expected_of(x, w, None, 2, padding=1)
    calls = [
        lambda: flux_dnn.conv2d(x, w, padding=[1, 1]),  # a list: the Python path decides what it means
        lambda: flux_dnn.conv2d(x, w, padding=np.int64(1)),  # not an exact int
        lambda: flux_dnn.conv2d(x, w, padding=1, out=np.full(expected.shape, np.nan, np.float32)),
        lambda: 2 * flux_dnn.conv2d(x, w, padding=1, alpha=0.5),  # keyword options
        lambda: flux_dnn.conv2d(x[:, ::-1][:, ::-1], w, padding=1),  # a view is an ndarray like any other
    ]
    for call in calls[:4]:
        for _ in range(2):
            close(call(), expected)
        assert _core.remembered_forward_count() == 0
    close(calls[4](), expected)
    same = flux_dnn.conv2d(x, w, padding="same")
    close(same, expected)
    assert _core.remembered_forward_count() == 1  # the ndarray view, not the string padding


def test_forgetting_the_python_memo_forgets_the_core_s(rng):
    x, w = fresh(rng, (1, 2, 5, 5)), fresh(rng, (2, 2, 1, 1))
    flux_dnn.conv2d(x, w)
    assert _core.remembered_forward_count() == 1
    _conv._memo.clear()
    assert _core.remembered_forward_count() == 0
    close(flux_dnn.conv2d(x, w), expected_of(x, w, None, 2))


def test_bad_arguments_still_get_the_python_words(rng):
    x, w = fresh(rng, (1, 2, 5, 5)), fresh(rng, (2, 2, 3, 3))
    flux_dnn.conv2d(x, w)
    with pytest.raises(ValueError, match="groups"):
        flux_dnn.conv2d(x, w, groups=3)
    with pytest.raises(ValueError, match="x"):
        flux_dnn.conv2d(x[:, :1], w)
    with pytest.raises(TypeError, match="dtype"):
        flux_dnn.conv2d(x.astype(np.float64), w)


def test_misaligned_inputs_of_a_remembered_pattern(rng):
    """Same shapes and strides at another data alignment: the core's plan cache keys on it."""
    x, w = fresh(rng, (1, 4, 8, 8)), fresh(rng, (4, 4, 3, 3))
    flux_dnn.conv2d(x, w, padding=1)
    buffer = np.empty(x.size + 1, np.float32)
    shifted = buffer[1:].reshape(x.shape)  # 4 bytes past an aligned start
    shifted[...] = fresh(rng, x.shape)
    close(flux_dnn.conv2d(shifted, w, padding=1), expected_of(shifted, w, None, 2, padding=1))


def test_threads_share_a_remembered_pattern(rng):
    w = fresh(rng, (4, 4, 3, 3))
    inputs = [fresh(rng, (1, 4, 8, 8)) for _ in range(8)]
    flux_dnn.conv2d(inputs[0], w, padding=1)
    results = [None] * len(inputs)

    def run(i):
        for _ in range(50):
            results[i] = flux_dnn.conv2d(inputs[i], w, padding=1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(inputs, results):
        close(y, expected_of(x, w, None, 2, padding=1))


def test_a_plan_makes_numpy_outputs_in_its_layout(rng):
    w = fresh(rng, (5, 3, 3, 3))
    for channels_last in (False, True):
        x = fresh(rng, (2, 3, 7, 6), channels_last=channels_last)
        plan = flux_dnn.conv_plan(x, w, padding=1)
        first = plan(x)
        x2 = fresh(rng, x.shape, channels_last=channels_last)
        y = plan(x2)
        assert y is not first and y.strides == first.strides and y.flags.writeable
        assert (y.strides[1] < y.strides[3]) == channels_last
        close(y, expected_of(x2, w, None, 2, padding=1))


# ---- torch tensors, through DLPack's exchange API (torch >= 2.11) ---------------------------


def _torch_with_exchange_api():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no DLPack exchange API (__dlpack_c_exchange_api__)")
    return torch


@pytest.mark.parametrize("case", list(CASES))
def test_a_repeated_torch_pattern_is_answered_by_the_core(rng, case):
    """The same memo serves torch CPU tensors: the core reads them and makes their outputs
    through torch's exchange API, so a repeated pattern is one C call, as with NumPy."""
    torch = _torch_with_exchange_api()
    nd, x_shape, w_shape, with_bias, geometry = CASES[case]
    conv = {1: flux_dnn.conv1d, 2: flux_dnn.conv2d, 3: flux_dnn.conv3d}[nd]
    w = fresh(rng, w_shape)
    b = fresh(rng, (w_shape[0],)) if with_bias else None
    tw, tb = torch.from_numpy(w), None if b is None else torch.from_numpy(b)
    first = conv(torch.from_numpy(fresh(rng, x_shape)), tw, tb, **geometry)
    assert _core.remembered_forward_count() == 1
    for _ in range(3):
        x = fresh(rng, x_shape)
        answered = _core.remembered_forward(nd, torch.from_numpy(x), tw, tb, *geometry_args(geometry))
        y = conv(torch.from_numpy(x), tw, tb, **geometry)
        assert type(answered) is torch.Tensor and y is not first
        assert y.dtype == torch.float32 and y.stride() == first.stride() and y.is_contiguous()
        close(y.numpy(), expected_of(x, w, b, nd, **geometry))
        close(answered.numpy(), expected_of(x, w, b, nd, **geometry))
    assert _core.remembered_forward_count() == 1


def geometry_args(geometry: dict) -> tuple:
    """(stride, padding, dilation, groups) as conv*d takes them positionally."""
    return tuple(geometry.get(k, d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1)))


def test_torch_channels_last_and_grad_tensors_stay_right(rng):
    """A channels-last torch output is made by the Python path (the exchange allocator makes
    compact arrays only): not remembered, and still channels-last; a tensor that requires
    grad is read as it is (the exchange API takes it without detaching)."""
    torch = _torch_with_exchange_api()
    x, w = fresh(rng, (2, 4, 7, 7)), fresh(rng, (6, 4, 3, 3))
    tx = torch.from_numpy(x).to(memory_format=torch.channels_last)
    for _ in range(2):
        y = flux_dnn.conv2d(tx, torch.from_numpy(w), padding=1)
        assert y.is_contiguous(memory_format=torch.channels_last)
        close(y.numpy(), expected_of(x, w, None, 2, padding=1))
    assert _core.remembered_forward_count() == 0
    tg = torch.from_numpy(x).requires_grad_(True)
    for _ in range(2):
        close(flux_dnn.conv2d(tg, torch.from_numpy(w), padding=1).numpy(), expected_of(x, w, None, 2, padding=1))


def test_numpy_and_torch_patterns_of_one_shape_are_told_apart(rng):
    """The core's key holds the arrays' type: the same shapes in NumPy and torch are two
    patterns, each answered with an output of its own library."""
    torch = _torch_with_exchange_api()
    x, w = fresh(rng, (1, 2, 5, 5)), fresh(rng, (3, 2, 3, 3))
    assert isinstance(flux_dnn.conv2d(x, w), np.ndarray)
    assert isinstance(flux_dnn.conv2d(torch.from_numpy(x), torch.from_numpy(w)), torch.Tensor)
    assert _core.remembered_forward_count() == 2
    assert isinstance(flux_dnn.conv2d(x, w), np.ndarray)
    y = flux_dnn.conv2d(torch.from_numpy(x), torch.from_numpy(w))
    assert isinstance(y, torch.Tensor)
    close(y.numpy(), expected_of(x, w, None, 2))


def test_a_plan_makes_torch_outputs_in_the_core(rng):
    """plan(x) on torch CPU tensors: a compact output is made by the core through torch's
    allocator (the call slot, no Python frame), a channels-last one by the Python path."""
    torch = _torch_with_exchange_api()
    w, b = fresh(rng, (5, 3, 3, 3)), fresh(rng, (5,))
    for channels_last in (False, True):
        x = fresh(rng, (2, 3, 7, 6))
        tx = torch.from_numpy(x)
        if channels_last:
            tx = tx.to(memory_format=torch.channels_last)
        plan = flux_dnn.conv_plan(tx, torch.from_numpy(w), torch.from_numpy(b), padding=1)
        first = plan(tx)
        x2 = fresh(rng, x.shape)
        tx2 = torch.from_numpy(x2)
        if channels_last:
            tx2 = tx2.to(memory_format=torch.channels_last)
        y = plan(tx2)
        assert type(y) is torch.Tensor and y is not first and y.stride() == first.stride()
        assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        close(y.numpy(), expected_of(x2, w, b, 2, padding=1))

"""Conformance of the cuDNN shim on CuPy arrays and torch CUDA tensors, against the float64
NumPy reference (reference.py): forward (bias, activations, alpha/beta), backward-data,
backward-weight with the bias gradient, transposed; 1-D/2-D/3-D; groups, depthwise,
dilation, asymmetric padding; float16/bfloat16/float32/float64; contiguous and
channels-last; outputs poisoned with NaN first; streams other than the default.

Needs an NVIDIA GPU: everything here is skipped with the reason otherwise. scripts/
gpu_check.sh runs it on a lent GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import flux_dnn
import reference as ref


def _cudnn_status():
    for s in flux_dnn.shims():
        if s.name == "cudnn":
            return s
    return None


def _skip_reason():
    s = _cudnn_status()
    if s is None:
        return "no CUDA device: the cudnn shim is not installed (pip install flux-dnn-cuda13)"
    if not s.usable:
        return f"no CUDA device: {s.reason}"
    return None


SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


# ---- array libraries ---------------------------------------------------------------------

class Torch:
    name = "torch"
    dtypes = ("float16", "bfloat16", "float32", "float64")

    def __init__(self):
        import torch
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device: torch sees none")
        self.t = torch

    def put(self, a, dtype):  # NumPy float64 -> device array of dtype
        return self.t.from_numpy(np.ascontiguousarray(a)).to("cuda", getattr(self.t, dtype))

    def get(self, a):
        return a.detach().to(self.t.float64).cpu().numpy()

    def transpose(self, a, perm):
        return a.permute(*perm)

    def contiguous(self, a):
        return a.contiguous()

    def full_nan(self, shape, like):
        return self.t.full(shape, float("nan"), dtype=like.dtype, device=like.device)

    def stream_context(self):
        return self.t.cuda.stream(self.t.cuda.Stream())

    def synchronize(self):
        self.t.cuda.synchronize()


class Cupy:
    name = "cupy"
    dtypes = ("float16", "float32", "float64")  # CuPy has no bfloat16

    def __init__(self):
        import cupy
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device: CuPy sees none")
        self.cp = cupy

    def put(self, a, dtype):
        return self.cp.asarray(a.astype(dtype))

    def get(self, a):
        return self.cp.asnumpy(a).astype(np.float64)

    def transpose(self, a, perm):
        return a.transpose(perm)

    def contiguous(self, a):
        return self.cp.ascontiguousarray(a)

    def full_nan(self, shape, like):
        return self.cp.full(shape, np.nan, dtype=like.dtype)

    def stream_context(self):
        return self.cp.cuda.Stream(non_blocking=True)

    def synchronize(self):
        self.cp.cuda.get_current_stream().synchronize()
        self.cp.cuda.Device().synchronize()


LIBRARIES = {"torch": Torch, "cupy": Cupy}


@pytest.fixture(params=sorted(LIBRARIES))
def lib(request):
    pytest.importorskip(request.param)
    return LIBRARIES[request.param]()


def channels_last(lib, a):
    """The same logical array with channels-last memory: N, *spatial, C."""
    nd = a.ndim
    perm = (0, *range(2, nd), 1)
    inverse = (0, nd - 1, *range(1, nd - 1))
    return lib.transpose(lib.contiguous(lib.transpose(a, perm)), inverse)


def layout(lib, a, name):
    return channels_last(lib, a) if name == "channels_last" else a


def poisoned(lib, shape, like, layout_name):
    return layout(lib, lib.full_nan(shape, like), layout_name)


# ---- tolerances --------------------------------------------------------------------------

def tolerance(dtype, expected, reduced):
    scale = max(1.0, float(np.abs(expected).max()))
    rel = {"float64": 1e-10, "float32": 2e-2 if reduced else 2e-4, "float16": 1e-2,
           "bfloat16": 4e-2}[dtype]
    return dict(rtol=rel, atol=rel * scale)


def rounded(a, dtype):
    """The float64 values a array of `dtype` really holds (inputs are quantized first)."""
    if dtype == "bfloat16":
        bits = np.asarray(a, np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return bits.view(np.float32).astype(np.float64)
    return np.asarray(a).astype(dtype).astype(np.float64)


# ---- random problems ---------------------------------------------------------------------

def draw(rng, nd):
    groups = int(rng.choice([1, 1, 2, 3]))
    depthwise = rng.random() < 0.25
    cg = 1 if depthwise else int(rng.integers(1, 5))
    kg = 1 if depthwise else int(rng.integers(1, 5))
    kernel = tuple(int(v) for v in rng.integers(1, 4, nd))
    dilation = tuple(int(v) for v in rng.integers(1, 3, nd))
    size = 7 if nd == 3 else 12
    spatial = tuple(int(max(v, d * (k - 1) + 1))
                    for v, d, k in zip(rng.integers(3, size, nd), dilation, kernel))
    return dict(N=int(rng.choice([1, 2, 3])), C=cg * groups, K=kg * groups, groups=groups,
                kernel=kernel, stride=tuple(int(v) for v in rng.integers(1, 3, nd)),
                dilation=dilation, lo=tuple(int(v) for v in rng.integers(0, 3, nd)),
                hi=tuple(int(v) for v in rng.integers(0, 3, nd)), spatial=spatial)


def operands(rng, c, dtype):
    x = rounded(rng.standard_normal((c["N"], c["C"], *c["spatial"])), dtype)
    w = rounded(rng.standard_normal((c["K"], c["C"] // c["groups"], *c["kernel"])), dtype)
    b = rounded(rng.standard_normal(c["K"]), dtype)
    y = ref.conv_forward(x, w, None, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    dy = rounded(rng.standard_normal(y.shape), dtype)
    return x, w, b, dy


def geometry(c):
    return dict(stride=c["stride"], padding=tuple(zip(c["lo"], c["hi"])),
                dilation=c["dilation"], groups=c["groups"])


DTYPES = ["float16", "bfloat16", "float32", "float64"]
LAYOUTS = ["contiguous", "channels_last"]


def _skip_dtype(lib, dtype):
    if dtype not in lib.dtypes:
        pytest.skip(f"{lib.name} has no {dtype}")


def api(name):
    """A public flux_dnn function; skips while the Python layer does not have it yet."""
    fn = getattr(flux_dnn, name, None)
    if fn is None:
        pytest.skip(f"flux_dnn has no {name} yet")
    return fn


# ---- the ops -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(lib, rng, dtype, layout_name, nd, case):
    _skip_dtype(lib, dtype)
    c = draw(rng, nd)
    x, w, b, _ = operands(rng, c, dtype)
    expected = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    xd = layout(lib, lib.put(x, dtype), layout_name)
    wd, bd = lib.put(w, dtype), lib.put(b, dtype)
    out = poisoned(lib, expected.shape, xd, layout_name)
    result = flux_dnn.conv(xd, wd, bd, out=out, **geometry(c))
    assert result is out
    got = lib.get(out)
    assert not np.isnan(got).any(), f"unwritten output elements for {c}"
    np.testing.assert_allclose(got, expected, **tolerance(dtype, expected, True), err_msg=str(c))


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_data(lib, rng, dtype, layout_name, nd, case):
    _skip_dtype(lib, dtype)
    c = draw(rng, nd)
    x, w, _, dy = operands(rng, c, dtype)
    expected = ref.conv_backward_data(dy, w, x.shape, c["stride"], c["lo"], c["hi"], c["dilation"],
                                      c["groups"])
    dyd = layout(lib, lib.put(dy, dtype), layout_name)
    out = poisoned(lib, x.shape, dyd, layout_name)
    result = api("conv_backward_data")(dyd, lib.put(w, dtype), x.shape, out=out, **geometry(c))
    assert result is out
    got = lib.get(out)
    assert not np.isnan(got).any(), f"unwritten output elements for {c}"
    np.testing.assert_allclose(got, expected, **tolerance(dtype, expected, True), err_msg=str(c))


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_weight_and_bias(lib, rng, dtype, layout_name, nd, case):
    _skip_dtype(lib, dtype)
    c = draw(rng, nd)
    x, w, _, dy = operands(rng, c, dtype)
    expected_dw = ref.conv_backward_weight(x, dy, w.shape, c["stride"], c["lo"], c["hi"],
                                           c["dilation"], c["groups"])
    expected_db = dy.sum(axis=(0, *range(2, dy.ndim)))
    xd = layout(lib, lib.put(x, dtype), layout_name)
    dyd = layout(lib, lib.put(dy, dtype), layout_name)
    dw_out = poisoned(lib, w.shape, xd, "contiguous")
    db_out = lib.full_nan((c["K"],), xd)
    dw, db = api("conv_backward_weight")(xd, dyd, w.shape, bias_grad=True, out=(dw_out, db_out),
                                           **geometry(c))
    assert dw is dw_out and db is db_out
    for got, expected in ((lib.get(dw), expected_dw), (lib.get(db), expected_db)):
        assert not np.isnan(got).any(), f"unwritten output elements for {c}"
        np.testing.assert_allclose(got, expected, **tolerance(dtype, expected, True), err_msg=str(c))


ACTIVATIONS = {
    "relu": lambda v: np.maximum(v, 0),
    ("leaky_relu", 0.1): lambda v: np.where(v >= 0, v, 0.1 * v),
    ("clip", -0.5, 0.5): lambda v: np.clip(v, -0.5, 0.5),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1 + np.exp(-v)),
}


@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_forward_epilogue_alpha_activation_beta(lib, rng, dtype, activation):
    """out = act(alpha * (conv + bias)) + beta * out_old (flux_dnn.h)."""
    _skip_dtype(lib, dtype)
    c = draw(rng, 2)
    x, w, b, _ = operands(rng, c, dtype)
    conv = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    old = rounded(rng.standard_normal(conv.shape), dtype)
    alpha, beta = 0.75, 0.5
    expected = ACTIVATIONS[activation](alpha * conv) + beta * old
    xd = lib.put(x, dtype)
    out = lib.put(old, dtype)
    flux_dnn.conv(xd, lib.put(w, dtype), lib.put(b, dtype), activation=activation, alpha=alpha,
                  beta=beta, out=out, allow_reduced_precision=False, **geometry(c))
    np.testing.assert_allclose(lib.get(out), expected, **tolerance(dtype, expected, False),
                               err_msg=str(c))


@pytest.mark.parametrize("activation", [None, "relu", "silu", ("clip", -0.5, 0.5)], ids=str)
@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_forward_bias_activation_fusable(lib, rng, dtype, layout_name, activation):
    """alpha 1, beta 0: the shape cuDNN's fused conv+bias+activation graphs take (the shim
    uses one when cuDNN offers an engine, else its own epilogue kernel)."""
    _skip_dtype(lib, dtype)
    c = draw(rng, 2)
    x, w, b, _ = operands(rng, c, dtype)
    conv = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    expected = conv if activation is None else ACTIVATIONS[activation](conv)
    for algorithm in ("heuristic", "benchmark") if activation == "relu" else ("heuristic",):
        xd = layout(lib, lib.put(x, dtype), layout_name)
        out = poisoned(lib, expected.shape, xd, layout_name)
        flux_dnn.conv(xd, lib.put(w, dtype), lib.put(b, dtype), activation=activation, out=out,
                      algorithm=algorithm, **geometry(c))
        got = lib.get(out)
        assert not np.isnan(got).any(), f"unwritten output elements for {c}"
        np.testing.assert_allclose(got, expected, **tolerance(dtype, expected, True),
                                   err_msg=f"{algorithm} {c}")


@pytest.mark.parametrize("algorithm", ["heuristic", "benchmark"])
def test_float32_without_tf32_is_exact_to_float32(lib, rng, algorithm):
    c = draw(rng, 2)
    x, w, b, _ = operands(rng, c, "float32")
    expected = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    got = flux_dnn.conv(lib.put(x, "float32"), lib.put(w, "float32"), lib.put(b, "float32"),
                        allow_reduced_precision=False, algorithm=algorithm, **geometry(c))
    np.testing.assert_allclose(lib.get(got), expected, **tolerance("float32", expected, False))


def test_deterministic_is_bitwise_reproducible(lib, rng):
    c = dict(N=8, C=16, K=16, groups=1, kernel=(3, 3), stride=(1, 1), dilation=(1, 1),
             lo=(1, 1), hi=(1, 1), spatial=(20, 20))
    x, w, _, dy = operands(rng, c, "float32")
    xd, dyd = lib.put(x, "float32"), lib.put(dy, "float32")
    runs = [lib.get(api("conv_backward_weight")(xd, dyd, w.shape, padding=1, deterministic=True))
            for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_runs_on_the_current_non_default_stream(lib, rng):
    c = dict(N=4, C=8, K=8, groups=1, kernel=(3, 3), stride=(1, 1), dilation=(1, 1),
             lo=(1, 1), hi=(1, 1), spatial=(32, 32))
    x, w, b, _ = operands(rng, c, "float32")
    expected = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    with lib.stream_context():
        xd, wd, bd = lib.put(x, "float32"), lib.put(w, "float32"), lib.put(b, "float32")
        results = [flux_dnn.conv(xd, wd, bd, padding=1) for _ in range(4)]
        got = [lib.get(r) for r in results]  # copies on the same stream, ordered after the conv
    lib.synchronize()
    for g in got:
        np.testing.assert_allclose(g, expected, **tolerance("float32", expected, True))


def test_transposed_convolution(lib, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 6, 9, 7))
    w = rng.standard_normal((6, 4, 3, 3))
    expected = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1, output_padding=1).numpy()
    got = api("conv_transpose")(lib.put(x, "float64"), lib.put(w, "float64"), stride=2,
                                  padding=1, output_padding=1)
    np.testing.assert_allclose(lib.get(got), expected, **tolerance("float64", expected, False))


def test_workspace_limit_zero_still_computes(lib, rng):
    c = draw(rng, 2)
    x, w, b, _ = operands(rng, c, "float32")
    expected = ref.conv_forward(x, w, b, c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    got = flux_dnn.conv(lib.put(x, "float32"), lib.put(w, "float32"), lib.put(b, "float32"),
                        workspace_limit=0, **geometry(c))
    np.testing.assert_allclose(lib.get(got), expected, **tolerance("float32", expected, True))

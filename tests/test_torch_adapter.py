"""flux_dnn.torch against PyTorch's own convolutions: values and gradients (reference: torch's
autograd in float64), modules, state_dict, convert, torch.compile, autocast, errors."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flux_dnn.torch as ft  # noqa: E402

TOL = dict(rtol=2e-4, atol=2e-4)  # float32 against a float64 reference


def randn(rng, *shape, requires_grad=False):
    t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    return t.requires_grad_(requires_grad)


def grads_of(fn, inputs, g):
    """fn(*inputs) and the gradients of <fn(*inputs), g> w.r.t. every tensor input."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    y = fn(*leaves)
    (y * g.to(y.dtype)).sum().backward()
    return y.detach(), [t.grad if t is not None else None for t in leaves]


def check_against_torch(flux_fn, torch_fn, inputs, rng):
    """Output and every gradient of flux_fn equal torch_fn's, computed in float64."""
    ref_inputs = [t.double() if t is not None else None for t in inputs]
    y_ref = torch_fn(*ref_inputs)
    g = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref, ref_grads = grads_of(torch_fn, ref_inputs, g)
    y, grads = grads_of(flux_fn, inputs, g)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, y_ref.float(), **TOL)
    for name, got, want in zip(("x", "w", "bias"), grads, ref_grads):
        if want is None:
            continue
        assert got is not None, f"no gradient for {name}"
        torch.testing.assert_close(got, want.float(), **TOL, msg=lambda m, name=name: f"grad {name}: {m}")


@pytest.fixture(params=["autograd.Function", "custom_op"])
def eager_path(request, monkeypatch):
    """Eager calls go through a torch.autograd.Function; torch.compile through the custom
    operators. Run the gradient checks through both."""
    monkeypatch.setattr(ft, "_EAGER_CUSTOM_OPS", request.param == "custom_op")
    return request.param


# (nd, N, C, K, spatial, kernel, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (1, 2, 4, 6, (11,), (3,), 2, 1, 1, 2, True),
    (2, 2, 3, 4, (9, 8), (3, 3), 1, "same", 1, 1, True),
    (2, 2, 4, 6, (10, 9), (3, 2), (2, 1), (1, 0), (1, 2), 2, False),
    (2, 1, 4, 4, (7, 7), (3, 3), 1, 1, 1, 4, True),  # depthwise
    (2, 3, 2, 5, (6, 7), (1, 1), 1, 0, 1, 1, True),  # 1x1
    (3, 1, 2, 4, (5, 6, 5), (3, 3, 2), (1, 2, 1), 1, 1, 1, True),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}d-s{c[6]}-p{c[7]}-d{c[8]}-g{c[9]}")
def test_conv_values_and_gradients(case, rng, eager_path):
    nd, N, C, K, sp, k, stride, padding, dilation, groups, has_bias = case
    x = randn(rng, N, C, *sp)
    w = randn(rng, K, C // groups, *k)
    b = randn(rng, K) if has_bias else None
    flux_f = {1: ft.conv1d, 2: ft.conv2d, 3: ft.conv3d}[nd]
    torch_f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    check_against_torch(
        lambda x, w, b: flux_f(x, w, b, stride, padding, dilation, groups),
        lambda x, w, b: torch_f(x, w, b, stride, padding, dilation, groups),
        [x, w, b],
        rng,
    )


# (nd, N, C_in, C_out, spatial, kernel, stride, padding, output_padding, dilation, groups, bias)
TRANSPOSE_CASES = [
    (1, 2, 4, 6, (7,), (3,), 2, 1, 1, 1, 2, True),
    (2, 2, 3, 4, (5, 6), (3, 3), 2, 1, (1, 0), 1, 1, True),
    (2, 1, 2, 2, (4, 4), (3, 3), 1, 1, 1, 2, 1, False),  # output_padding >= stride (< dilation)
    (2, 2, 2, 4, (4, 5), (3, 2), 1, 0, 1, 2, 2, True),  # the same without padding: a last row no window reaches
    (1, 1, 2, 3, (1,), (1,), 1, 1, 2, 3, 1, True),  # no row within reach: zeros (and the bias)
    (3, 1, 2, 3, (3, 4, 3), (2, 3, 2), (2, 1, 2), (0, 1, 0), 0, 1, 1, True),
]


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=lambda c: f"{c[0]}d-s{c[6]}-p{c[7]}-op{c[8]}-d{c[9]}-g{c[10]}")
def test_conv_transpose_values_and_gradients(case, rng, eager_path):
    nd, N, C_in, C_out, sp, k, stride, padding, out_pad, dilation, groups, has_bias = case
    x = randn(rng, N, C_in, *sp)
    w = randn(rng, C_in, C_out // groups, *k)
    b = randn(rng, C_out) if has_bias else None
    flux_f = {1: ft.conv_transpose1d, 2: ft.conv_transpose2d, 3: ft.conv_transpose3d}[nd]
    torch_f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    check_against_torch(
        lambda x, w, b: flux_f(x, w, b, stride, padding, out_pad, groups, dilation),
        lambda x, w, b: torch_f(x, w, b, stride, padding, out_pad, groups, dilation),
        [x, w, b],
        rng,
    )


def test_channels_last_gradients(rng, eager_path):
    x = randn(rng, 2, 8, 6, 7).to(memory_format=torch.channels_last)
    w = randn(rng, 4, 8, 3, 3).to(memory_format=torch.channels_last)
    b = randn(rng, 4)
    y = ft.conv2d(x, w, b, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last)
    check_against_torch(
        lambda x, w, b: ft.conv2d(x, w, b, 1, 1), lambda x, w, b: F.conv2d(x, w, b, 1, 1), [x, w, b], rng
    )


def test_only_requested_gradients(rng, eager_path):
    """Frozen weights or inputs: only the gradients autograd asks for are computed and given."""
    x = randn(rng, 2, 3, 6, 6, requires_grad=True)
    w = randn(rng, 4, 3, 3, 3)
    ft.conv2d(x, w).sum().backward()
    assert x.grad is not None and w.grad is None
    x2 = randn(rng, 2, 3, 6, 6)
    w2 = randn(rng, 4, 3, 3, 3, requires_grad=True)
    ft.conv2d(x2, w2).sum().backward()
    torch.testing.assert_close(w2.grad, torch.nn.grad.conv2d_weight(x2, w2.shape, torch.ones(2, 4, 4, 4)), **TOL)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode(mode, rng, eager_path):
    x = randn(rng, 2, 3, 8, 8, requires_grad=True)
    w = randn(rng, 5, 3, 3, 3, requires_grad=True)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        y = ft.conv2d(x, w, padding=1)
        yt = ft.conv_transpose2d(randn(rng, 2, 5, 4, 4), w, stride=2)
    assert not y.requires_grad and y.grad_fn is None and not yt.requires_grad
    if mode == "inference_mode":
        assert y.is_inference()
    torch.testing.assert_close(y, F.conv2d(x.detach(), w.detach(), padding=1), **TOL)


MODULE_PAIRS = [
    (torch.nn.Conv1d, ft.Conv1d, (2, 4, 11)),
    (torch.nn.Conv2d, ft.Conv2d, (2, 4, 9, 8)),
    (torch.nn.Conv3d, ft.Conv3d, (1, 4, 5, 6, 5)),
    (torch.nn.ConvTranspose1d, ft.ConvTranspose1d, (2, 4, 7)),
    (torch.nn.ConvTranspose2d, ft.ConvTranspose2d, (2, 4, 5, 6)),
    (torch.nn.ConvTranspose3d, ft.ConvTranspose3d, (1, 4, 3, 4, 3)),
]


@pytest.mark.parametrize("torch_cls,flux_cls,xshape", MODULE_PAIRS, ids=lambda v: getattr(v, "__name__", ""))
def test_state_dict_round_trip(torch_cls, flux_cls, xshape, rng):
    """Same constructor, same state_dict keys; weights move both ways; outputs and gradients agree."""
    kw = dict(stride=2, padding=1, groups=2, bias=True)
    ref = torch_cls(4, 6, 3, **kw)
    mine = flux_cls(4, 6, 3, **kw)
    assert isinstance(mine, torch_cls)
    assert list(mine.state_dict()) == list(ref.state_dict())
    mine.load_state_dict(ref.state_dict())
    back = torch_cls(4, 6, 3, **kw)
    back.load_state_dict(mine.state_dict())
    x = randn(rng, *xshape)
    check_against_torch(
        lambda x, w, b: torch.func.functional_call(mine, {"weight": w, "bias": b}, (x,)),
        lambda x, w, b: torch.func.functional_call(back, {"weight": w, "bias": b}, (x,)),
        [x, ref.weight.detach(), ref.bias.detach()],
        rng,
    )


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
def test_padding_modes(padding_mode, rng):
    ref = torch.nn.Conv2d(3, 4, (3, 2), padding=(1, 1), padding_mode=padding_mode)
    mine = ft.Conv2d(3, 4, (3, 2), padding=(1, 1), padding_mode=padding_mode)
    mine.load_state_dict(ref.state_dict())
    x = randn(rng, 2, 3, 7, 6)
    torch.testing.assert_close(mine(x), ref(x), **TOL)
    same = ft.Conv1d(3, 4, 4, padding="same", padding_mode=padding_mode)
    same_ref = torch.nn.Conv1d(3, 4, 4, padding="same", padding_mode=padding_mode)
    same.load_state_dict(same_ref.state_dict())
    x1 = randn(rng, 2, 3, 9)
    with warnings.catch_warnings():  # torch warns that its asymmetric 'same' copies the input
        warnings.simplefilter("ignore", UserWarning)
        want = same_ref(x1)
    torch.testing.assert_close(same(x1), want, **TOL)


def test_unbatched_input_and_output_size(rng):
    conv = ft.Conv2d(3, 4, 3, padding=1)
    x = randn(rng, 3, 6, 6)
    torch.testing.assert_close(conv(x), F.conv2d(x, conv.weight, conv.bias, padding=1), **TOL)
    up = ft.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
    ref = torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
    ref.load_state_dict(up.state_dict())
    z = randn(rng, 1, 4, 5, 5)
    assert up(z, output_size=[10, 10]).shape == (1, 2, 10, 10)
    torch.testing.assert_close(up(z, output_size=[10, 10]), ref(z, output_size=[10, 10]), **TOL)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
        )
        self.dec = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = torch.nn.Conv1d(4, 2, 3, padding_mode="circular", padding=1)

    def forward(self, x):
        y = self.dec(torch.relu(self.enc(x)))
        return self.head(y.flatten(2))


def test_convert_keeps_weights_and_outputs(rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = _Net()
    x = randn(rng, 2, 3, 8, 8)
    before = model(x).detach()
    params = list(model.parameters())
    assert ft.convert(model) is model
    kinds = {type(m) for m in model.modules()}
    assert {ft.Conv2d, ft.ConvTranspose2d, ft.Conv1d} <= kinds
    assert not kinds & {torch.nn.Conv2d, torch.nn.ConvTranspose2d, torch.nn.Conv1d}
    assert all(a is b for a, b in zip(params, model.parameters()))  # same Parameter objects
    torch.testing.assert_close(model(x), before, **TOL)
    loss = model(x).square().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_convert_leaves_subclasses_alone():
    class MyConv(torch.nn.Conv2d):
        pass

    m = torch.nn.Sequential(MyConv(2, 2, 1), torch.nn.Conv2d(2, 2, 1))
    ft.convert(m)
    assert type(m[0]) is MyConv and type(m[1]) is ft.Conv2d
    with pytest.raises(TypeError, match="model"):
        ft.convert("not a model")


def test_torch_compile_matches_eager(rng):
    """AOTAutograd traces the custom ops through their fake implementations, forward and
    backward. backend='aot_eager' avoids Inductor's C++ compile (minutes on this CI's CPUs)."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = ft.convert(_Net())
    x = randn(rng, 2, 3, 8, 8)
    eager_y = model(x)
    eager_y.square().mean().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    y.square().mean().backward()
    torch.testing.assert_close(y, eager_y, **TOL)
    for got, want in zip((p.grad for p in model.parameters()), eager_grads):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["contiguous", "channels_last"])
# opcheck of torch 2.14 reads .grad of a non-leaf tensor of its own making and warns
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_opcheck(fmt, rng):
    """torch.library.opcheck: schema, fake implementations (strides included), autograd
    registration and AOT dispatch of every custom op agree with the real kernels."""

    def r(*shape, grad=False):
        return randn(rng, *shape).to(memory_format=fmt).requires_grad_(grad)

    x, w, b = r(2, 4, 7, 6, grad=True), r(6, 2, 3, 3, grad=True), randn(rng, 6)
    torch.library.opcheck(torch.ops.flux_dnn.conv.default, (x, w, b, [2, 1], [1, 0], [1, 2], [1, 1], 2, False))
    xt, wt = r(2, 4, 5, 5, grad=True), r(4, 3, 3, 3, grad=True)
    torch.library.opcheck(
        torch.ops.flux_dnn.conv_transpose.default, (xt, wt, randn(rng, 3), [2, 2], [1, 1], [1, 0], [1, 1], 1, False)
    )
    dy = r(2, 6, 4, 6)
    torch.library.opcheck(
        torch.ops.flux_dnn.conv_backward_data.default,
        (dy, w.detach(), [2, 4, 7, 6], [2, 1], [1, 0], [1, 2], [1, 1], 2, False),
    )
    torch.library.opcheck(
        torch.ops.flux_dnn.conv_backward_weight.default,
        (x.detach(), dy, [6, 2, 3, 3], [2, 1], [1, 0], [1, 2], [1, 1], 2, True, False),
    )


def test_bf16_autocast(rng):
    """Under CPU autocast flux convs run in bfloat16, like torch.nn.functional.conv2d."""
    x = randn(rng, 2, 8, 8, 8)
    w = randn(rng, 8, 8, 3, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ft.conv2d(x, w, padding=1)
        ref = F.conv2d(x, w, padding=1)
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.conv2d(x, w, padding=1), rtol=3e-2, atol=0.15)
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and torch.isfinite(w.grad).all()


def test_errors_are_python_exceptions(rng):
    x = randn(rng, 2, 3, 8, 8)
    with pytest.raises(ValueError, match="groups"):
        ft.conv2d(x, randn(rng, 4, 2, 3, 3), groups=2)  # 3 channels, 2 groups
    with pytest.raises(ValueError, match="stride"):
        ft.conv2d(x, randn(rng, 4, 3, 3, 3), stride=0)
    with pytest.raises(TypeError, match="dtype"):
        ft.conv2d(x.to(torch.complex64), randn(rng, 4, 3, 3, 3).to(torch.complex64))
    with pytest.raises(ValueError, match="x"):
        ft.Conv2d(3, 4, 3)(randn(rng, 8, 8))
    with pytest.raises(TypeError, match="x"):
        ft.conv2d(x.numpy(), randn(rng, 4, 3, 3, 3))
    with pytest.raises(ValueError, match="output_padding"):
        ft.conv_transpose2d(x, randn(rng, 3, 2, 3, 3), stride=2, output_padding=2)
    compiled = torch.compile(lambda x, w: ft.conv2d(x, w, groups=2), backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match="groups"):  # the same exception from inside torch.compile
        compiled(x, randn(rng, 4, 2, 3, 3))


def test_import_flux_dnn_does_not_import_frameworks():
    code = "import sys, flux_dnn; bad = {'torch', 'jax'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and the cuDNN shim")
def test_cuda_tensors_go_through_flux_dnn(rng):
    x = randn(rng, 2, 3, 9, 9).cuda()
    w = randn(rng, 4, 3, 3, 3).cuda()
    b = randn(rng, 4).cuda()
    check_against_torch(
        lambda x, w, b: ft.conv2d(x, w, b, 2, 1), lambda x, w, b: F.conv2d(x, w, b, 2, 1), [x, w, b], rng
    )


def test_concurrent_threads_agree_with_torch(rng):
    """flux_dnn's plan cache and memo are shared by threads: concurrent forward and backward
    calls of several shapes all give torch's results."""
    from concurrent.futures import ThreadPoolExecutor

    cases = []
    for i in range(8):
        c, k, h = int(rng.integers(1, 5)), int(rng.integers(1, 6)), int(rng.integers(5, 10))
        cases.append(
            (randn(rng, 2, c, h, h, requires_grad=True), randn(rng, k, c, 3, 3, requires_grad=True), 1 + i % 2)
        )

    def run(case):
        x, w, stride = case
        y = ft.conv2d(x, w, None, stride, 1)
        gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
        return y.detach(), gx, gw

    def reference(case):
        x, w, stride = case
        y = F.conv2d(x, w, None, stride, 1)
        gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
        return y.detach(), gx, gw

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases * 4))
    for case, got in zip(cases * 4, results):
        for a, b in zip(got, reference(case)):
            torch.testing.assert_close(a, b, **TOL)


def test_second_derivatives_raise_instead_of_dropping_terms(rng, eager_path):
    """flux_dnn's backward ops have no gradients of their own: differentiating a gradient
    (e.g. a gradient penalty) must fail loudly, not leave the conv terms out."""
    x = randn(rng, 2, 3, 6, 6, requires_grad=True)
    w = randn(rng, 4, 3, 3, 3, requires_grad=True)
    (gx,) = torch.autograd.grad(ft.conv2d(x, w, padding=1).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|no autograd formula"):
        gx.square().sum().backward()

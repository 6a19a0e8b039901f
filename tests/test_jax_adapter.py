"""flux_dnn.jax against jax.lax.conv_general_dilated: values and jax.grad, under jit and vmap."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flux_dnn  # noqa: E402
import flux_dnn.jax as fj  # noqa: E402

RTOL = 2e-4  # float32, relative to the largest magnitude of the reference


@pytest.fixture(autouse=True, params=["ffi", "callback"])
def backend(request, monkeypatch):
    """Every test runs through the XLA FFI handler and through jax.pure_callback."""
    if request.param == "ffi" and not fj.ffi_available():
        why = fj._ffi_state.get("reason")
        pytest.skip(f"the XLA FFI handler is not installed (pip install ./packaging/flux-dnn-jax): {why}")
    monkeypatch.setattr(fj, "_BACKEND", request.param)
    return request.param


@pytest.fixture(autouse=True)
def on_cpu():
    """CPU arrays unless a test asks for another device (on a GPU machine, jnp arrays would
    default to the GPU, which the pure_callback path does not serve)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def close(got, want, what=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= RTOL * scale, f"{what}: max error {err} > {RTOL} * {scale}"


def randn(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def lax_conv(x, w, stride, padding, dilation, groups):
    return jax.lax.conv_general_dilated(
        x, w, stride, padding, rhs_dilation=dilation, feature_group_count=groups, precision=jax.lax.Precision.HIGHEST
    )


def lax_conv_transpose(x, w, stride, padding, output_padding, dilation, groups):
    """torch-semantics transposed convolution by its definition: a convolution of x spread out
    by the stride (lhs_dilation), padded by d*(k-1)-p below and d*(k-1)-p+output_padding above,
    with the kernel flipped and its channel roles exchanged per group."""
    nd, (c_in, c_out_g, *k) = x.ndim - 2, w.shape
    w = jnp.flip(w, tuple(range(2, nd + 2)))
    w = w.reshape(groups, c_in // groups, c_out_g, *k).swapaxes(1, 2).reshape(groups * c_out_g, c_in // groups, *k)
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, op, d in zip(k, padding, output_padding, dilation)]
    return jax.lax.conv_general_dilated(
        x,
        w,
        (1,) * nd,
        pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        feature_group_count=groups,
        precision=jax.lax.Precision.HIGHEST,
    )


def check_grads(flux_fn, ref_fn, args, rng):
    """Values and jax.grad of <fn(*args), g> in every argument, flux under jit."""
    g = randn(rng, *ref_fn(*args).shape)
    argnums = tuple(range(len(args)))
    loss = lambda fn: lambda *a: jnp.vdot(fn(*a), g)  # noqa: E731
    close(jax.jit(flux_fn)(*args), ref_fn(*args), "value")
    got = jax.jit(jax.grad(loss(flux_fn), argnums))(*args)
    want = jax.grad(loss(ref_fn), argnums)(*args)
    for i, (a, b) in enumerate(zip(got, want)):
        close(a, b, f"grad of argument {i}")


# (N, C, K, spatial, kernel, stride, padding pairs, dilation, groups)
CONV_CASES = [
    (2, 4, 6, (11,), (3,), (2,), [(1, 2)], (1,), 2),
    (2, 3, 4, (9, 8), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), 1),
    (2, 4, 6, (10, 9), (3, 2), (2, 1), [(1, 0), (0, 2)], (1, 2), 2),
    (1, 4, 4, (7, 7), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), 4),
    (1, 2, 4, (5, 6, 5), (3, 3, 2), (1, 2, 1), [(1, 1), (1, 1), (0, 1)], (1, 1, 1), 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{len(c[3])}d-s{c[5]}-d{c[7]}-g{c[8]}")
def test_conv_values_and_grads(case, rng):
    N, C, K, sp, k, stride, padding, dilation, groups = case
    x, w, b = randn(rng, N, C, *sp), randn(rng, K, C // groups, *k), randn(rng, K)
    nd = len(sp)
    flux = lambda x, w, b: fj.conv(x, w, b, stride, padding, dilation, groups)  # noqa: E731
    ref = lambda x, w, b: (
        lax_conv(x, w, stride, padding, dilation, groups)  # noqa: E731
        + b.reshape((1, -1) + (1,) * nd)
    )
    check_grads(flux, ref, (x, w, b), rng)


# (N, C_in, C_out, spatial, kernel, stride, padding, output_padding, dilation, groups)
TRANSPOSE_CASES = [
    (2, 4, 6, (7,), (3,), (2,), (1,), (1,), (1,), 2),
    (2, 3, 4, (5, 6), (3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1),
    (1, 2, 3, (3, 4, 3), (2, 3, 2), (2, 1, 2), (0, 1, 0), (0, 0, 0), (1, 1, 1), 1),
    (2, 4, 4, (4, 5), (3, 2), (1, 1), (0, 0), (1, 1), (2, 2), 2),  # last rows no window reaches
    (1, 2, 3, (1,), (1,), (1,), (1,), (2,), (3,), 1),  # no row within reach: zeros
]


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=lambda c: f"{len(c[3])}d-s{c[5]}-op{c[7]}-g{c[9]}")
def test_conv_transpose_values_and_grads(case, rng):
    N, C_in, C_out, sp, k, stride, padding, out_pad, dilation, groups = case
    x, w = randn(rng, N, C_in, *sp), randn(rng, C_in, C_out // groups, *k)
    flux = lambda x, w: fj.conv_transpose(x, w, None, stride, padding, out_pad, groups, dilation)  # noqa: E731
    ref = lambda x, w: lax_conv_transpose(x, w, stride, padding, out_pad, dilation, groups)  # noqa: E731
    check_grads(flux, ref, (x, w), rng)


def test_vmap_over_inputs_and_weights(rng):
    """vmap over x alone (folded into the batch) and over x and w (folded into groups), and
    per-example weight gradients (vmap of grad)."""
    xs, w, ws = randn(rng, 3, 2, 4, 7, 6), randn(rng, 6, 2, 3, 3), randn(rng, 3, 6, 2, 3, 3)
    flux = lambda x, w: fj.conv(x, w, None, 2, 1, 1, 2)  # noqa: E731
    ref = lambda x, w: lax_conv(x, w, (2, 2), [(1, 1), (1, 1)], (1, 1), 2)  # noqa: E731
    close(jax.jit(jax.vmap(flux, (0, None)))(xs, w), jax.vmap(ref, (0, None))(xs, w), "vmap x")
    close(jax.vmap(flux)(xs, ws), jax.vmap(ref)(xs, ws), "vmap x and w")
    close(jax.vmap(flux, (None, 0))(xs[0], ws), jax.vmap(ref, (None, 0))(xs[0], ws), "vmap w")
    loss = lambda fn: lambda x, w: jnp.sum(fn(x, w) ** 2)  # noqa: E731
    per_example = jax.vmap(jax.grad(loss(flux), argnums=(0, 1)), (0, None))
    for a, b in zip(per_example(xs, w), jax.vmap(jax.grad(loss(ref), argnums=(0, 1)), (0, None))(xs, w)):
        close(a, b, "per-example grad")
    xt, wt = randn(rng, 3, 2, 4, 5, 5), randn(rng, 3, 4, 3, 3, 3)
    tflux = lambda x, w: fj.conv_transpose(x, w, None, 2, 1, 1)  # noqa: E731
    tref = lambda x, w: lax_conv_transpose(x, w, (2, 2), (1, 1), (1, 1), (1, 1), 1)  # noqa: E731
    close(jax.vmap(tflux)(xt, wt), jax.vmap(tref)(xt, wt), "vmap conv_transpose")


@pytest.mark.parametrize(
    "dn,padding", [(("NHWC", "HWIO", "NHWC"), "SAME"), (None, "VALID"), (("NCHW", "OIHW", "NHWC"), [(2, 0), (1, 1)])]
)
def test_conv_general_dilated_matches_lax(dn, padding, rng):
    x = randn(rng, 2, 9, 8, 6) if dn and dn[0] == "NHWC" else randn(rng, 2, 6, 9, 8)
    w = randn(rng, 3, 3, 3, 4) if dn and dn[1] == "HWIO" else randn(rng, 4, 3, 3, 3)
    kw = dict(window_strides=(2, 1), padding=padding, rhs_dilation=(1, 2), dimension_numbers=dn, feature_group_count=2)
    flux = lambda x, w: fj.conv_general_dilated(x, w, **kw)  # noqa: E731
    ref = lambda x, w: jax.lax.conv_general_dilated(x, w, precision=jax.lax.Precision.HIGHEST, **kw)  # noqa: E731
    check_grads(flux, ref, (x, w), rng)


def test_errors_are_python_exceptions_at_trace_time(rng):
    x = randn(rng, 2, 3, 8, 8)
    with pytest.raises(ValueError, match="groups"):
        jax.jit(lambda x, w: fj.conv(x, w, groups=2))(x, randn(rng, 4, 2, 3, 3))
    with pytest.raises(ValueError, match="stride"):
        fj.conv(x, randn(rng, 4, 3, 3, 3), stride=0)
    with pytest.raises(TypeError, match="int32"):
        fj.conv(x.astype(jnp.int32), randn(rng, 4, 3, 3, 3).astype(jnp.int32))
    with pytest.raises(ValueError, match="String padding"):  # lax's own refusal, raised by lax
        fj.conv_general_dilated(x, randn(rng, 4, 3, 3, 3), (1, 1), "SAME", lhs_dilation=(2, 2))
    with pytest.raises(TypeError, match="lhs: flux_dnn.jax computes .* got int32"):
        fj.conv_general_dilated(x.astype(jnp.int32), jnp.ones((4, 3, 3, 3), jnp.int32), (1, 1), "SAME")
    with pytest.raises(ValueError, match="algorithm"):
        fj.conv(x, randn(rng, 4, 3, 3, 3), algorithm="fastest")
    with pytest.raises(ValueError, match="x"):
        fj.conv2d(randn(rng, 2, 3, 8), randn(rng, 4, 3, 3))


def test_import_flux_dnn_does_not_import_jax():
    code = "import sys, flux_dnn; assert 'jax' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bfloat16_through_ffi(backend, rng):
    """bfloat16 arrays run on the FFI path and through pure_callback (NumPy arrays of
    ml_dtypes' bfloat16)."""
    x, w = randn(rng, 2, 8, 8, 8), randn(rng, 8, 8, 3, 3)
    y = jax.jit(lambda x, w: fj.conv(x, w, padding=1))(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    want = lax_conv(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 1)
    err = float(jnp.abs(y.astype(jnp.float32) - want).max())
    assert err <= 3e-2 * float(jnp.abs(want).max()), err


def test_cuda_arrays_values_and_grads(backend, rng):
    """CUDA arrays through the CUDA FFI handler (cuDNN shim, JAX's stream, XLA's scratch
    workspace): values and grads under jit, eagerly and under vmap, results left on the GPU.
    The pure_callback path refuses them."""
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as exc:
        pytest.skip(f"no JAX GPU device: {exc}")
    flux = lambda x, w, b: fj.conv(x, w, b, (2, 1), [(1, 0), (0, 2)], (1, 2), 2)  # noqa: E731
    ref = lambda x, w, b: lax_conv(x, w, (2, 1), [(1, 0), (0, 2)], (1, 2), 2) + b.reshape(1, -1, 1, 1)  # noqa: E731
    with jax.default_device(gpu):
        x, w, b = randn(rng, 2, 4, 10, 9), randn(rng, 6, 2, 3, 2), randn(rng, 6)
        if backend == "callback":
            with pytest.raises(flux_dnn.DeviceUnavailableError, match="FFI handler"):
                jax.jit(flux)(x, w, b)
            return
        y = flux(x, w, b)
        assert y.devices() == {gpu}
        close(y, ref(x, w, b), "eager value")
        check_grads(flux, ref, (x, w, b), rng)
        xs = randn(rng, 3, 2, 4, 10, 9)
        close(jax.jit(jax.vmap(flux, (0, None, None)))(xs, w, b), jax.vmap(ref, (0, None, None))(xs, w, b), "vmap")
        xt, wt = randn(rng, 2, 4, 5, 6), randn(rng, 4, 3, 3, 3)
        close(
            jax.jit(lambda x, w: fj.conv_transpose(x, w, None, 2, 1, 1))(xt, wt),
            lax_conv_transpose(xt, wt, (2, 2), (1, 1), (1, 1), (1, 1), 1),
            "conv_transpose",
        )


def test_empty_operands_give_zeros(rng):
    """An empty batch computes nothing, and its weight gradient is zero (flux_dnn.jax returns
    zeros itself: the CUDA handler cannot clear device memory)."""
    x, w = randn(rng, 0, 2, 6, 6), randn(rng, 3, 2, 3, 3)
    y, grads = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(fj.conv(x, w, padding=1)), (0, 1)))(x, w)
    assert float(y) == 0.0
    assert grads[0].shape == x.shape and grads[1].shape == w.shape and not jnp.any(grads[1])


def test_trace_time_shapes_ask_no_shim():
    """Output shapes and argument checks at trace time come from shape rules alone (the GPU
    check machine, a GPU-only install with no CPU shim, found jax.vjp of a CUDA conv failing
    with 'no flux_dnn shim is installed for CPU arrays'). FLUX_DNN_SHIMS names only a shim
    that cannot load on Linux, so any dispatch would raise; the callback path asks no shim
    until it runs."""
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, flux_dnn.jax as fj
        fj._BACKEND = "callback"
        s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        f = lambda x, w: fj.conv(x, w, None, 2, ((1, 0), (2, 1)), 1, 2)
        print(jax.eval_shape(f, s(2, 6, 9, 7), s(4, 3, 3, 2)).shape)
        t = lambda x, w: fj.conv_transpose(x, w, None, 2, 0, 0, 3)
        print(jax.eval_shape(t, s(2, 6, 9, 7), s(6, 2, 3, 3)).shape)
        g = lambda x, w: fj.conv_general_dilated(x, w, (1, 2), ((1, 2), (3, -1)), (2, 1), (1, 2), batch_group_count=2)
        print(jax.eval_shape(jax.grad(lambda x, w: g(x, w).sum(), (0, 1)), s(4, 3, 9, 10), s(6, 3, 4, 5))[1].shape)
        try:
            jax.eval_shape(lambda x, w: fj.conv(x, w, groups=4), s(2, 6, 9, 7), s(4, 3, 3, 2))
        except ValueError as exc:
            print("ValueError", str(exc).split(":")[0])
        """
    )
    env = {**__import__("os").environ, "FLUX_DNN_SHIMS": "mps"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # (9 + 1 - 3) // 2 + 1 = 4, (7 + 3 - 2) // 2 + 1 = 5; transposed: (9 - 1) * 2 + 3 = 19, (7 - 1) * 2 + 3 = 15
    assert out.stdout.splitlines() == ["(2, 4, 4, 5)", "(2, 6, 19, 15)", "(6, 3, 4, 5)", "ValueError groups"], (
        out.stdout
    )


def lax_general(*args, **kwargs):
    return jax.lax.conv_general_dilated(*args, precision=jax.lax.Precision.HIGHEST, **kwargs)


# (lhs shape, rhs shape, keyword arguments of conv_general_dilated) beyond JAX's grid: 1-D and
# 3-D, any dimension order, negative padding with lhs dilation and strides, batch groups with
# lhs dilation, a 0-D convolution (a matrix product).
GENERAL_CASES = [
    ((2, 3, 11), (4, 3, 3), dict(window_strides=(3,), padding=((-2, 4),), lhs_dilation=(2,), rhs_dilation=(2,))),
    (
        (6, 4, 3, 5, 2),
        (3, 2, 2, 2, 4),
        dict(
            window_strides=(1, 2, 1),
            padding=((1, 0), (2, -1), (0, 3)),
            lhs_dilation=(2, 1, 1),
            batch_group_count=2,
            dimension_numbers=("NHWDC", "DHWIO", "CNHWD"),
        ),
    ),
    (
        (3, 2, 9, 8),
        (1, 6, 3, 2),
        dict(
            window_strides=(2, 1),
            padding=((3, -2), (0, 1)),
            lhs_dilation=(3, 2),
            feature_group_count=3,
            dimension_numbers=("CNHW", "IOHW", "HWNC"),
        ),
    ),
    ((5, 6), (6, 4), dict(window_strides=(), padding=(), dimension_numbers=("NC", "IO", "NC"))),
]


@pytest.mark.parametrize("case", GENERAL_CASES, ids=lambda c: f"{len(c[0]) - 2}d-{sorted(c[2])}")
def test_conv_general_dilated_beyond_the_grid(case, rng):
    lhs_shape, rhs_shape, kw = case
    lhs, rhs = randn(rng, *lhs_shape), randn(rng, *rhs_shape)
    check_grads(lambda a, b: fj.conv_general_dilated(a, b, **kw), lambda a, b: lax_general(a, b, **kw), (lhs, rhs), rng)


def test_conv_general_dilated_vmap_and_second_order(rng):
    """vmap over lhs, over rhs and over both, and the gradient of a gradient, of a
    fractionally strided, batch-grouped problem."""
    kw = dict(window_strides=(1, 2), padding=((2, 1), (1, 1)), lhs_dilation=(2, 1), batch_group_count=2)
    flux = lambda a, b: fj.conv_general_dilated(a, b, **kw)  # noqa: E731
    ref = lambda a, b: lax_general(a, b, **kw)  # noqa: E731
    lhs, rhs = randn(rng, 3, 4, 2, 6, 7), randn(rng, 3, 6, 2, 3, 2)
    for axes in [(0, None), (None, 0), (0, 0)]:
        a, b = (lhs if axes[0] == 0 else lhs[0]), (rhs if axes[1] == 0 else rhs[0])
        close(jax.jit(jax.vmap(flux, axes))(a, b), jax.vmap(ref, axes)(a, b), f"vmap {axes}")
    second = lambda fn: jax.grad(lambda b: jnp.sum(jax.grad(lambda a: jnp.sum(fn(a, b) ** 2))(lhs[0]) ** 2))  # noqa: E731
    close(jax.jit(second(flux))(rhs[0]), second(ref)(rhs[0]), "gradient of a gradient")


def test_conv_general_dilated_zero_size_arrays(rng):
    """Zero-size dims give lax's shape: an empty result, or zeros when the padding is wider
    than the kernel (nothing is summed); gradients are zeros of the arguments' shapes."""
    rhs = randn(rng, 3, 2, 4, 5)
    for lhs_shape, padding, want in [
        ((2, 2, 9, 0), ((10, 8), (7, 13)), (2, 3, 24, 16)),
        ((2, 2, 9, 0), ((1, 2), (2, 0)), (2, 3, 9, 0)),
        ((0, 2, 9, 10), ((1, 2), (2, 0)), (0, 3, 9, 8)),
    ]:
        lhs = randn(rng, *lhs_shape)
        f = lambda a, b, padding=padding: fj.conv_general_dilated(a, b, (1, 1), padding)  # noqa: E731
        y = jax.jit(f)(lhs, rhs)
        assert y.shape == want == lax_general(lhs, rhs, (1, 1), padding).shape
        assert not jnp.any(y)
        grads = jax.grad(lambda a, b, f=f: jnp.sum(f(a, b)), (0, 1))(lhs, rhs)
        assert grads[0].shape == lhs.shape and grads[1].shape == rhs.shape and not jnp.any(grads[1])


def test_conv_general_dilated_preferred_element_type(rng):
    """bfloat16 inputs with a float32 result: accumulated in float32 from the exact inputs,
    far closer to the float64 result than a bfloat16 result could be."""
    lhs, rhs = randn(rng, 2, 8, 9, 9).astype(jnp.bfloat16), randn(rng, 4, 8, 3, 3).astype(jnp.bfloat16)
    kw = dict(window_strides=(1, 1), padding="SAME", preferred_element_type=jnp.float32)
    y = jax.jit(lambda a, b: fj.conv_general_dilated(a, b, **kw))(lhs, rhs)
    assert y.dtype == jnp.float32
    close(y, lax_general(lhs.astype(jnp.float32), rhs.astype(jnp.float32), (1, 1), "SAME"), "float32 result")
    half = fj.conv_general_dilated(lhs.astype(jnp.float16), rhs.astype(jnp.float16), (1, 1), "SAME")
    assert half.dtype == jnp.float16
    with pytest.raises(TypeError, match="narrower"):  # lax's own refusal
        fj.conv_general_dilated(lhs.astype(jnp.float32), rhs.astype(jnp.float32), (1, 1), "SAME",
                                preferred_element_type=jnp.bfloat16)  # fmt: skip


def ffi_attributes(fn, *args):
    """The attributes of the flux_dnn custom calls of jit(fn) (the FFI path)."""
    import re

    text = jax.jit(fn).lower(*args).as_text()
    return re.findall(rf"custom_call @{fj._FFI_TARGET}\(.*?\) \{{(.*?)\}} :", text)


def test_precision_and_options_reach_the_call(backend, rng):
    """lax's precision and jax.default_matmul_precision("highest") ask for full float32 math
    (the flags without ALLOW_REDUCED_PRECISION); other precisions keep the device's default
    (flags -1); explicit options (issue 29) win. On the callback path, the same options reach
    flux_dnn's ops as keywords."""
    from flux_dnn import _core
    from flux_dnn._options import ConvOptions

    assert fj._keywords(ConvOptions(algorithm="benchmark", deterministic=True)) == {
        "algorithm": "benchmark",
        "deterministic": True,
    }
    assert fj._precision_allows_reduced(jax.lax.Precision.HIGHEST) is False
    assert fj._precision_allows_reduced((jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST)) is False
    assert fj._precision_allows_reduced(jax.lax.Precision.DEFAULT) is None
    with jax.default_matmul_precision("float32"):
        assert fj._precision_allows_reduced(None) is False
    if backend != "ffi":
        return
    x, w = randn(rng, 2, 3, 8, 8), randn(rng, 4, 3, 3, 3)
    cases = [
        (dict(), "flags = -1", "algo_policy = 0"),
        (dict(precision=jax.lax.Precision.DEFAULT), "flags = -1", "algo_policy = 0"),
        (dict(precision=jax.lax.Precision.HIGHEST), "flags = 0", "algo_policy = 0"),
        (dict(allow_reduced_precision=True), f"flags = {_core.CONV_ALLOW_REDUCED_PRECISION}", "algo_policy = 0"),
        (dict(deterministic=True, algorithm="benchmark"), f"flags = {_core.CONV_DETERMINISTIC}", "algo_policy = 1"),
    ]
    for kw, flags, policy in cases:
        call = lambda x, w, kw=kw: fj.conv_general_dilated(x, w, (1, 1), "SAME", **kw)  # noqa: E731
        for attributes in ffi_attributes(call, x, w):
            assert f"{flags} :" in attributes and f"{policy} :" in attributes, (kw, attributes)
    with jax.default_matmul_precision("highest"):
        (attributes,) = ffi_attributes(lambda x, w: fj.conv_general_dilated(x, w, (1, 1), "SAME"), x, w)
        assert "flags = 0 :" in attributes
    (attributes,) = ffi_attributes(lambda x, w: fj.conv(x, w, algorithm=3, deterministic=True), x, w)
    assert "algo_id = 3 :" in attributes and "algo_policy = 2 :" in attributes
    y = jax.jit(lambda x, w: fj.conv(x, w, padding=1, deterministic=True, algorithm="benchmark"))(x, w)
    close(y, lax_conv(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 1), "deterministic, benchmarked")

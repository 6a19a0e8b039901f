"""Flax models on flux_dnn: nnx.Conv and linen.Conv take ``conv_general_dilated=``; a CNN built
with flux_dnn.jax.conv_general_dilated trains with optax step for step like the same model on
jax.lax.conv_general_dilated (losses and gradients). Flax's ConvTranspose calls
lax.conv_transpose itself and takes no convolution function, so it is not covered."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
from flax import linen, nnx  # noqa: E402

import flux_dnn.jax as fj  # noqa: E402

STEPS = 4
RTOL = 2e-4  # float32: relative to the largest magnitude of lax's value


@pytest.fixture(autouse=True, params=["ffi", "callback"])
def backend(request, monkeypatch):
    if request.param == "ffi" and not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not installed: {fj._ffi_state.get('reason')}")
    monkeypatch.setattr(fj, "_BACKEND", request.param)
    with jax.default_device(jax.devices("cpu")[0]):
        yield request.param


def counted(calls):
    """flux_dnn.jax.conv_general_dilated, counting its calls (the model must trace it)."""

    def conv_general_dilated(*args, **kwargs):
        calls.append(kwargs)
        return fj.conv_general_dilated(*args, **kwargs)

    return conv_general_dilated


def close(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= RTOL * scale, f"{what}: max error {err} > {RTOL} * {scale}"


def batch(rng):
    """Images (NHWC, Flax's layout) and integer labels of 10 classes."""
    return jnp.asarray(rng.standard_normal((8, 12, 12, 3)).astype(np.float32)), jnp.asarray(rng.integers(0, 10, 8))


def loss_of(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


class NnxCNN(nnx.Module):
    """Convolutions with stride, kernel and input dilation, groups and padding modes."""

    def __init__(self, conv_fn, rngs):
        conv = dict(conv_general_dilated=conv_fn, rngs=rngs)
        self.c1 = nnx.Conv(3, 8, (3, 3), padding="SAME", **conv)
        self.c2 = nnx.Conv(8, 8, (3, 3), strides=2, padding=((1, 0), (0, 2)), feature_group_count=2, **conv)
        self.c3 = nnx.Conv(
            8, 16, (2, 3), kernel_dilation=(2, 1), input_dilation=(1, 2), padding=((0, 1), (1, 1)), **conv
        )
        self.head = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.c1(x))
        x = nnx.relu(self.c2(x))
        x = nnx.relu(self.c3(x))
        return self.head(x.mean(axis=(1, 2)))


def test_nnx_cnn_trains_like_lax(rng):
    x, labels = batch(rng)
    calls = []
    models = {
        name: NnxCNN(fn, nnx.Rngs(0)) for name, fn in (("flux", counted(calls)), ("lax", jax.lax.conv_general_dilated))
    }
    optimizers = {name: nnx.Optimizer(m, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param) for name, m in models.items()}

    @nnx.jit
    def step(model, optimizer, x, labels):
        loss, grads = nnx.value_and_grad(lambda m: loss_of(m(x), labels))(model)
        optimizer.update(model, grads)
        return loss, grads

    for i in range(STEPS):
        (lf, gf), (ll, gl) = (step(models[n], optimizers[n], x, labels) for n in ("flux", "lax"))
        close(lf, ll, f"loss at step {i}")
        for (path, a), (_, b) in zip(nnx.to_flat_state(gf), nnx.to_flat_state(gl)):
            close(a[...], b[...], f"gradient of {path} at step {i}")
    assert len(calls) >= 3  # each Conv traced it
    assert float(lf) < float(loss_of(NnxCNN(jax.lax.conv_general_dilated, nnx.Rngs(0))(x), labels))


class LinenCNN(linen.Module):
    conv_fn: object

    @linen.compact
    def __call__(self, x):
        conv = dict(conv_general_dilated=self.conv_fn)
        x = linen.relu(linen.Conv(8, (3, 3), padding="SAME", **conv)(x))
        x = linen.relu(linen.Conv(8, (3, 3), strides=2, padding="CIRCULAR", feature_group_count=2, **conv)(x))
        x = linen.relu(linen.Conv(16, (3, 3), padding=((1, 1), (2, 0)), kernel_dilation=2, **conv)(x))
        return linen.Dense(10)(x.mean(axis=(1, 2)))


def test_linen_cnn_trains_like_lax(rng):
    x, labels = batch(rng)
    calls = []
    flux, lax = LinenCNN(counted(calls)), LinenCNN(jax.lax.conv_general_dilated)
    params = flux.init(jax.random.key(0), x)
    tx = optax.adam(1e-2)
    state = {"flux": (params, tx.init(params)), "lax": (params, tx.init(params))}

    def step(model):
        @jax.jit
        def run(params, opt_state):
            loss, grads = jax.value_and_grad(lambda p: loss_of(model.apply(p, x), labels))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, grads

        return run

    steps = {"flux": step(flux), "lax": step(lax)}
    for i in range(STEPS):
        out = {}
        for name in ("flux", "lax"):
            params_n, opt_n, loss, grads = steps[name](*state[name])
            state[name] = (params_n, opt_n)
            out[name] = (loss, grads)
        close(out["flux"][0], out["lax"][0], f"loss at step {i}")
        flat = [jax.tree_util.tree_leaves_with_path(out[n][1]) for n in ("flux", "lax")]
        for (path, a), (_, b) in zip(*flat):
            close(a, b, f"gradient of {jax.tree_util.keystr(path)} at step {i}")
    assert len(calls) >= 3

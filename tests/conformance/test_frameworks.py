"""Autograd through the framework integrations on every backend whose library has one:
flux_dnn.torch (autograd.Function / custom ops) and flux_dnn.jax (custom_vjp, the XLA FFI
handler or a callback). The value and every gradient against the float64 reference."""

import pytest

import reference as ref

from . import problems as P
from .conftest import RANKS


def _torch_grads(backend, g, dtype, x, w, b, dy):
    import torch

    import flux_dnn.torch as ft

    lib = backend.lib
    xt, wt, bt = (lib.array(a, dtype).requires_grad_() for a in (x, w, b))
    y = ft.conv(xt, wt, bt, **g.kwargs())
    y.backward(lib.array(dy, dtype))
    assert isinstance(y, torch.Tensor)
    return y, xt.grad, wt.grad, bt.grad


def _jax_grads(backend, g, dtype, x, w, b, dy):
    import jax

    import flux_dnn.jax as fj

    lib = backend.lib
    y, vjp = jax.vjp(lambda x, w, b: fj.conv(x, w, b, **g.kwargs()), *(lib.array(a, dtype) for a in (x, w, b)))
    return (y, *vjp(lib.array(dy, dtype)))


FRAMEWORKS = {"torch": _torch_grads, "jax": _jax_grads}


def with_framework(lib) -> bool:
    """with a flux_dnn framework integration (flux_dnn.torch, flux_dnn.jax)"""
    return lib.name in FRAMEWORKS


@pytest.mark.matrix(where=with_framework, nd=RANKS)
def test_conv_value_and_gradients(backend, rng, nd):
    dtype = backend.some_dtype("forward", rng)  # drawn among those claimed
    cap = backend.require("forward", dtype, nd)
    backend.require("backward_data", dtype, nd)
    backend.require("backward_weight", dtype, nd)
    g = P.draw("forward", rng, nd, str(rng.choice(P.PADDING_FORMS)), cap, backend.lib)
    x, w, b, dy = (P.grid(rng, s) for s in (g.x_shape, g.w_shape, (g.K,), g.y_shape))
    y, dx, dw, db = FRAMEWORKS[backend.lib.name](backend, g, dtype, x, w, b, dy)
    context = f"{backend!r}, {dtype}, {g}"
    P.assert_close(backend.lib, y, ref.conv_forward(x, w, b, *g.ref()), dtype, "value", context)
    P.assert_close(backend.lib, dx, ref.conv_backward_data(dy, w, g.x_shape, *g.ref()), dtype, "x gradient", context)
    P.assert_close(backend.lib, dw, ref.conv_backward_weight(x, dy, g.w_shape, *g.ref()), dtype, "w gradient", context)
    P.assert_close(backend.lib, db, dy.sum(axis=(0, *range(2, nd + 2))), dtype, "bias gradient", context)

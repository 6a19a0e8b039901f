"""float64 on the CPU end to end: NumPy's default dtype, what torch.autograd.gradcheck and
JAX's x64 mode use. The BLAS shim computes it (oneDNN has no float64 convolution); these
tests go through the frameworks' adapters and compare with float64 references."""

import os
import subprocess
import sys

import numpy as np
import pytest

import flux_dnn
import reference as ref
from conftest import require_cpu_dtype


@pytest.fixture(autouse=True)
def float64_here():
    require_cpu_dtype("float64")


def test_numpy_float64_is_computed_in_float64(rng):
    """Inputs whose float32 rounding would show: a float32 computation misses by ~1e-7."""
    x = rng.standard_normal((2, 5, 11, 9))
    w = rng.standard_normal((6, 5, 3, 3))
    b = rng.standard_normal(6)
    y = flux_dnn.conv2d(x, w, b, stride=(2, 1), padding=((1, 0), (2, 1)))
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref.conv_forward(x, w, b, (2, 1), (1, 2), (0, 1)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
def test_torch_gradcheck_through_functional_ops(rng, groups):
    torch = pytest.importorskip("torch")
    import flux_dnn.torch as ft

    def t(*shape):
        return torch.from_numpy(rng.standard_normal(shape)).requires_grad_()

    x, w, b = t(2, 4, 6, 5), t(6, 4 // groups, 3, 2), t(6)
    assert torch.autograd.gradcheck(
        lambda x, w, b: ft.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=groups), (x, w, b)
    )
    xt, wt = t(2, 4, 5), t(4, 6 // groups, 3)
    assert torch.autograd.gradcheck(
        lambda x, w: ft.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1, groups=groups), (xt, wt)
    )


def test_torch_module_in_float64_matches_torch(rng):
    torch = pytest.importorskip("torch")
    import flux_dnn.torch as ft

    torch.manual_seed(int(rng.integers(1 << 31)))
    mine = ft.Conv3d(3, 4, 3, padding=1, stride=(1, 2, 1)).double()
    theirs = torch.nn.Conv3d(3, 4, 3, padding=1, stride=(1, 2, 1)).double()
    theirs.load_state_dict(mine.state_dict())
    x1 = torch.from_numpy(rng.standard_normal((2, 3, 5, 6, 4))).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    mine(x1).square().sum().backward()
    theirs(x2).square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.weight.grad, theirs.weight.grad, rtol=1e-12, atol=1e-11)
    torch.testing.assert_close(mine.bias.grad, theirs.bias.grad, rtol=1e-12, atol=1e-11)


JAX_X64 = r"""
import sys
import numpy as np, jax, jax.numpy as jnp
import flux_dnn.jax as fj

fj._BACKEND = sys.argv[1]
if fj._BACKEND == "ffi" and not fj.ffi_available():
    print("skip", fj._ffi_state.get("reason")); sys.exit(0)
rng = np.random.default_rng()
x = jnp.asarray(rng.standard_normal((2, 3, 8, 7)))
w = jnp.asarray(rng.standard_normal((4, 3, 3, 3)))
assert x.dtype == jnp.float64
def loss(conv):
    return lambda x, w: (conv(x, w) ** 2).sum()
mine = jax.jit(jax.grad(loss(lambda x, w: fj.conv2d(x, w, stride=(2, 1), padding=1)), argnums=(0, 1)))(x, w)
lax = lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 1), [(1, 1), (1, 1)], precision="highest")
want = jax.grad(loss(lax), argnums=(0, 1))(x, w)
for got, exp in zip(mine, want):
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-11, atol=1e-11)
print("ok")
"""


@pytest.mark.parametrize("backend", ["ffi", "callback"])
def test_jax_x64_grad(backend):
    """jax_enable_x64 is process-wide, so this runs in its own interpreter."""
    pytest.importorskip("jax")
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", JAX_X64, backend], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if result.stdout.startswith("skip"):
        pytest.skip(f"the XLA FFI handler is not installed: {result.stdout[5:].strip()}")
    assert result.stdout.strip() == "ok"

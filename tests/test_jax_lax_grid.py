"""flux_dnn.jax.conv_general_dilated on the parameter grid of JAX's own
``testConvGeneralDilated`` (jax tests/lax_test.py), against ``jax.lax.conv_general_dilated``
itself computed in float64: values and gradients, float32 and the 16-bit dtypes, every case
served (a refusal only where lax refuses).

The grid, written from that test's parameters: (batch_group_count, feature_group_count) in
{(1, 1), (2, 1), (1, 2)}; lhs (b * bgc, i * fgc, 9, w) with w in {0, 10} and rhs
(j * fgc * bgc, i, 4, 5) with b, i, j in {2, 3}; dimension numbers NCHW/OIHW/NCHW,
NHWC/HWIO/NHWC and NCHW/HWIO/NHWC; strides (1, 1) and (2, 1); padding ((1, 2), (2, 0)) and
((10, 8), (7, 13)); lhs and rhs dilation each in {(1, 1), (1, 2), (1, 4)}: 5184 cases per
dtype. CI runs a seeded random subset (FLUX_DNN_LAX_GRID=<count>, default 24, seed
FLUX_DNN_LAX_GRID_SEED, printed); the whole grid is one command, about 0.4 s a case:

    FLUX_DNN_LAX_GRID=all python -m pytest tests/test_jax_lax_grid.py -q
"""

import itertools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flux_dnn.jax as fj  # noqa: E402
from conftest import numpy_dtype  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16"]
# Errors relative to the largest magnitude of the float64 result (sums of up to 60 products
# of inputs of magnitude ~1, each rounded to the dtype; bfloat16 has 8 significant bits).
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}

LAYOUTS = [
    (("NCHW", "OIHW", "NCHW"), ((0, 1, 2, 3), (0, 1, 2, 3))),
    (("NHWC", "HWIO", "NHWC"), ((0, 2, 3, 1), (2, 3, 1, 0))),
    (("NCHW", "HWIO", "NHWC"), ((0, 1, 2, 3), (2, 3, 1, 0))),
]
DILATIONS = [(1, 1), (1, 2), (1, 4)]


def grid():
    """Every case of JAX's grid, per dtype, as (dtype, bgc, fgc, lhs shape, rhs shape,
    layout index, strides, padding, lhs dilation, rhs dilation)."""
    for dtype, (bgc, fgc), w, (b, i, j), layout, strides, padding, lhs_dil, rhs_dil in itertools.product(
        DTYPES,
        [(1, 1), (2, 1), (1, 2)],
        [0, 10],
        itertools.product([2, 3], repeat=3),
        range(len(LAYOUTS)),
        [(1, 1), (2, 1)],
        [((1, 2), (2, 0)), ((10, 8), (7, 13))],
        DILATIONS,
        DILATIONS,
    ):
        lhs_shape, rhs_shape = (b * bgc, i * fgc, 9, w), (j * fgc * bgc, i, 4, 5)
        yield dtype, bgc, fgc, lhs_shape, rhs_shape, layout, strides, padding, lhs_dil, rhs_dil


def selected():
    """The whole grid (FLUX_DNN_LAX_GRID=all), or a seeded random subset of it."""
    cases = list(grid())
    wanted = os.environ.get("FLUX_DNN_LAX_GRID", "24")
    if wanted == "all":
        return cases
    seed = int(os.environ.get("FLUX_DNN_LAX_GRID_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"lax grid subset seed: {seed} (FLUX_DNN_LAX_GRID_SEED)")
    picked = np.random.default_rng(seed).choice(len(cases), size=int(wanted), replace=False)
    return [cases[k] for k in sorted(picked)]


CASES = selected()


def case_id(case):
    dtype, bgc, fgc, lhs, rhs, layout, strides, padding, ld, rd = case
    return f"{dtype}-bg{bgc}-fg{fgc}-{lhs}-{rhs}-{LAYOUTS[layout][0][0]}-s{strides}-p{padding[0][0]}-ld{ld}-rd{rd}"


@pytest.fixture(params=["ffi", "callback"])
def backend(request, monkeypatch):
    if request.param == "ffi" and not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not installed: {fj._ffi_state.get('reason')}")
    monkeypatch.setattr(fj, "_BACKEND", request.param)
    with jax.default_device(jax.devices("cpu")[0]):
        yield request.param


def close(got, want, dtype, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.size == 0:
        return
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err} > {TOLERANCE[dtype]} * {scale}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_lax_grid_case(case, backend, rng):
    dtype, bgc, fgc, lhs_shape, rhs_shape, layout, strides, padding, lhs_dil, rhs_dil = case
    dn, (lhs_perm, rhs_perm) = LAYOUTS[layout]
    dt = numpy_dtype(dtype)
    lhs = rng.standard_normal(lhs_shape).astype(dt).transpose(lhs_perm)
    rhs = rng.standard_normal(rhs_shape).astype(dt).transpose(rhs_perm)
    kw = dict(
        window_strides=strides,
        padding=padding,
        lhs_dilation=lhs_dil,
        rhs_dilation=rhs_dil,
        dimension_numbers=dn,
        feature_group_count=fgc,
        batch_group_count=bgc,
    )
    try:
        shape = jax.eval_shape(lambda a, b: jax.lax.conv_general_dilated(a, b, **kw), lhs, rhs).shape
    except (TypeError, ValueError) as refusal:  # lax refuses: so must we, the same way
        with pytest.raises(type(refusal)):
            fj.conv_general_dilated(lhs, rhs, **kw)
        return
    g = rng.standard_normal(shape).astype(dt)

    @jax.jit
    def flux(a, b, g):
        y, vjp = jax.vjp(lambda a, b: fj.conv_general_dilated(a, b, **kw), a, b)
        return y, *vjp(g)

    with jax.enable_x64(True):  # the reference: lax itself, in float64, on the same inputs

        @jax.jit
        def reference(a, b, g):
            y, vjp = jax.vjp(lambda a, b: jax.lax.conv_general_dilated(a, b, **kw), a, b)
            return y, *vjp(g)

        wide = [jnp.asarray(np.asarray(a, np.float64)) for a in (lhs, rhs, g)]
        want = [np.asarray(a) for a in reference(*wide)]
    got = flux(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(g))
    assert got[0].dtype == dt
    for what, a, b in zip(("value", "lhs gradient", "rhs gradient"), got, want):
        close(a, b, dtype, what)

"""The whole op surface on the CPU: backward-data, backward-weight (with the bias gradient) and
transposed convolution, 1-D/2-D/3-D, float64/float32/float16/bfloat16 (NumPy, ml_dtypes'
bfloat16) and bfloat16 torch tensors, on the CPU shim that serves each dtype,
contiguous and channels-last, against the float64 reference; a finite-difference check that
the backward ops are the vector-Jacobian products of forward; accumulation with beta."""

import numpy as np
import pytest

import flux_dnn
import reference as ref
from conftest import DTYPES, numpy_dtype, require_cpu_dtype, require_onednn
from test_forward import draw_config

TOLERANCE = {"float64": 1e-12, "float32": 2e-4, "float16": 2e-3, "bfloat16": 1e-2}


def grid(rng, shape, dtype):
    """Values on a grid of quarters in [-1, 1], exact in every dtype under test, so only the
    output's rounding differs from the float64 reference."""
    return (rng.integers(-4, 5, shape) / 4).astype(numpy_dtype(dtype))


def assert_close(actual, expected, dtype_name, context=""):
    actual = np.asarray(actual, dtype=np.float64)
    tol = TOLERANCE[dtype_name]
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * max(1.0, float(np.abs(expected).max())),
                               err_msg=str(context))


def problem(rng, nd, dtype):
    c = draw_config(rng, nd)
    x = grid(rng, (c["N"], c["C"], *c["spatial"]), dtype)
    w = grid(rng, (c["K"], c["C"] // c["groups"], *c["kernel"]), dtype)
    y_shape = ref.conv_forward(x[:1, :1].repeat(c["C"], 1), w, None, c["stride"], c["lo"], c["hi"],
                               c["dilation"], c["groups"]).shape
    dy = grid(rng, (c["N"], *y_shape[1:]), dtype)
    geometry = dict(stride=c["stride"], padding=tuple(zip(c["lo"], c["hi"])), dilation=c["dilation"], groups=c["groups"])
    ref_geometry = (c["stride"], c["lo"], c["hi"], c["dilation"], c["groups"])
    return c, x, w, dy, geometry, ref_geometry


def layout(a, name):
    return ref.channels_last(a) if name == "channels_last" else a


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("layout_name", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_forward_with_epilogue(rng, nd, dtype, layout_name, case):
    """Forward with bias, a fused activation, alpha and beta accumulation in every dtype."""
    require_cpu_dtype(dtype)
    c, x, w, dy, geometry, rg = problem(rng, nd, dtype)
    b = grid(rng, (w.shape[0],), dtype)
    activation, fn = [("relu", lambda v: np.maximum(v, 0)), (("leaky_relu", 0.25), lambda v: np.where(v >= 0, v, v / 4)),
                      (("clip", -0.5, 0.75), lambda v: np.clip(v, -0.5, 0.75))][case]
    existing = grid(rng, dy.shape, dtype)
    out = layout(existing.copy(), layout_name)
    result = flux_dnn.conv(layout(x, layout_name), w, b, activation=activation, alpha=0.5, beta=1.0, out=out,
                           **geometry)
    assert result is out
    expected = fn(0.5 * ref.conv_forward(x, w, b, *rg)) + existing.astype(np.float64)  # the header's order
    assert_close(out, expected, dtype, c)


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("layout_name", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_backward_data(rng, nd, dtype, layout_name, case):
    require_cpu_dtype(dtype)
    c, x, w, dy, geometry, rg = problem(rng, nd, dtype)
    expected = ref.conv_backward_data(dy, w, x.shape, *rg)
    out = ref.poisoned_like(x.shape, numpy_dtype(dtype), layout_name == "channels_last")
    result = flux_dnn.conv_backward_data(layout(dy, layout_name), w, x.shape, out=out, **geometry)
    assert result is out and not np.isnan(out).any()
    assert_close(out, expected, dtype, c)


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("layout_name", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_backward_weight_and_bias(rng, nd, dtype, layout_name, case):
    require_cpu_dtype(dtype)
    c, x, w, dy, geometry, rg = problem(rng, nd, dtype)
    expected = ref.conv_backward_weight(x, dy, w.shape, *rg)
    dw_out = ref.poisoned_like(w.shape, numpy_dtype(dtype))
    db_out = ref.poisoned_like((w.shape[0],), numpy_dtype(dtype))
    dw, db = flux_dnn.conv_backward_weight(layout(x, layout_name), layout(dy, layout_name), w.shape,
                                           bias_grad=True, out=(dw_out, db_out), **geometry)
    assert dw is dw_out and db is db_out and not np.isnan(dw).any() and not np.isnan(db).any()
    assert_close(dw, expected, dtype, c)
    assert_close(db, dy.astype(np.float64).sum(axis=(0, *range(2, nd + 2))), dtype, c)
    assert_close(flux_dnn.conv_backward_bias(dy), dy.astype(np.float64).sum(axis=(0, *range(2, nd + 2))), dtype)


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_transposed_matches_definition(rng, nd, dtype, case):
    """conv_transpose against its scatter definition, output_padding >= stride included
    (allowed below dilation): out = (in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1."""
    require_cpu_dtype(dtype)
    groups = int(rng.choice([1, 2]))
    cin, cout_g = 2 * groups, int(rng.integers(1, 3))
    kernel = tuple(int(v) for v in rng.integers(1, 4, nd))
    stride = tuple(int(v) for v in rng.integers(1, 3, nd))
    dilation = tuple(int(v) for v in rng.integers(1, 3, nd))
    padding = tuple(int(rng.integers(0, (d * (k - 1)) // 2 + 1)) for d, k in zip(dilation, kernel))
    output_padding = tuple(int(rng.integers(0, max(s, d))) for s, d in zip(stride, dilation))
    spatial = tuple(int(v) for v in rng.integers(2, 6, nd))
    x = grid(rng, (2, cin, *spatial), dtype)
    w = grid(rng, (cin, cout_g, *kernel), dtype)
    b = grid(rng, (cout_g * groups,), dtype)
    y = flux_dnn.conv_transpose(x, w, b, stride, padding, output_padding, groups, dilation)
    out_sp = tuple((spatial[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
                   for i in range(nd))
    assert y.shape == (2, cout_g * groups, *out_sp)
    expected = ref.conv_transpose(x, w, b, stride, padding, output_padding, dilation, groups)
    assert_close(y, expected, dtype, (stride, padding, output_padding, dilation, groups, kernel))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_backward_ops_are_the_vjp_of_forward(rng, nd):
    """<dy, d/dt f(x + t v)> by central differences of flux_dnn's forward equals <dx, v> from
    backward_data (and likewise in w): the backward ops are forward's vector-Jacobian products."""
    c, x, w, dy, geometry, _ = problem(rng, nd, "float32")
    x, w, dy = (rng.standard_normal(a.shape).astype(np.float32) for a in (x, w, dy))
    vx = rng.standard_normal(x.shape).astype(np.float32)
    vw = rng.standard_normal(w.shape).astype(np.float32)
    h = np.float32(0.5)  # forward is linear in each argument: differences are exact up to rounding

    def f(xa, wa):
        return flux_dnn.conv(xa, wa, **geometry).astype(np.float64)

    fd_x = np.sum(dy * (f(x + h * vx, w) - f(x - h * vx, w))) / (2 * h)
    fd_w = np.sum(dy * (f(x, w + h * vw) - f(x, w - h * vw))) / (2 * h)
    dx = flux_dnn.conv_backward_data(dy, w, x.shape, **geometry).astype(np.float64)
    dw = flux_dnn.conv_backward_weight(x, dy, w.shape, **geometry).astype(np.float64)
    scale = np.sqrt(dy.size * c["C"] * np.prod(c["kernel"]))
    assert abs(np.sum(dx * vx) - fd_x) <= 1e-4 * scale * max(1.0, abs(fd_x) / scale), c
    assert abs(np.sum(dw * vw) - fd_w) <= 1e-4 * scale * max(1.0, abs(fd_w) / scale), c


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_beta_accumulates_and_alpha_scales(rng, op):
    c, x, w, dy, geometry, rg = problem(rng, 2, "float32")
    alpha, beta = 0.5, 1.0
    if op == "forward":
        base, shape = ref.conv_forward(x, w, None, *rg), dy.shape
        call = lambda out: flux_dnn.conv2d(x, w, out=out, alpha=alpha, beta=beta, **geometry)
    elif op == "backward_data":
        base, shape = ref.conv_backward_data(dy, w, x.shape, *rg), x.shape
        call = lambda out: flux_dnn.conv_backward_data(dy, w, x.shape, out=out, alpha=alpha, beta=beta, **geometry)
    else:
        base, shape = ref.conv_backward_weight(x, dy, w.shape, *rg), w.shape
        call = lambda out: flux_dnn.conv_backward_weight(x, dy, w.shape, out=out, alpha=alpha, beta=beta, **geometry)
    existing = rng.standard_normal(shape).astype(np.float32)
    out = existing.copy()
    call(out)
    assert_close(out, alpha * base + beta * existing.astype(np.float64), "float32", c)


@pytest.mark.parametrize("activation,fn", [
    ("relu", lambda v: np.maximum(v, 0)),
    (("leaky_relu", 0.1), lambda v: np.where(v >= 0, v, 0.1 * v)),
    (("clip", -0.5, 0.75), lambda v: np.clip(v, -0.5, 0.75)),
    ("sigmoid", lambda v: 1 / (1 + np.exp(-v))),
    ("tanh", np.tanh),
    ("silu", lambda v: v / (1 + np.exp(-v))),
])
def test_fused_activation(rng, activation, fn):
    x = rng.standard_normal((2, 3, 7, 6), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32) * 0.3
    b = rng.standard_normal(4, dtype=np.float32)
    expected = fn(ref.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1)))
    for layout_x in (x, ref.channels_last(x)):
        y = flux_dnn.conv2d(layout_x, w, b, padding=1, activation=activation)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_bfloat16_through_torch(rng, op):
    torch = pytest.importorskip("torch", reason="bfloat16 arrays come from torch (NumPy has no DLPack bfloat16)")
    c, x, w, dy, geometry, rg = problem(rng, 2, "float32")
    tx, tw, tdy = (torch.from_numpy(a).to(torch.bfloat16) for a in (x, w, dy))
    if op == "forward":
        result, expected = flux_dnn.conv2d(tx, tw, **geometry), ref.conv_forward(x, w, None, *rg)
    elif op == "backward_data":
        result, expected = flux_dnn.conv_backward_data(tdy, tw, x.shape, **geometry), ref.conv_backward_data(dy, w, x.shape, *rg)
    else:
        result, expected = flux_dnn.conv_backward_weight(tx, tdy, w.shape, **geometry), ref.conv_backward_weight(x, dy, w.shape, *rg)
    assert isinstance(result, torch.Tensor) and result.dtype == torch.bfloat16
    assert_close(result.float().numpy(), expected, "bfloat16", c)


def test_reduced_precision_flag_is_accepted_and_close(rng):
    x = rng.standard_normal((2, 16, 12, 12), dtype=np.float32)
    w = rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    exact = flux_dnn.conv2d(x, w, padding=1, deterministic=True)
    np.testing.assert_allclose(exact, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    reduced = flux_dnn.conv2d(x, w, padding=1, allow_reduced_precision=True)
    np.testing.assert_allclose(reduced, expected, rtol=3e-2, atol=3e-2 * np.abs(expected).max())


def test_benchmark_algorithm_and_given_id(rng, tmp_path):
    require_onednn()
    from flux_dnn import _core

    saved = _core.autotune_path()
    _core.set_autotune_path(str(tmp_path / "cache" / "autotune.txt"))  # the directory is made
    x = rng.standard_normal((2, 8, 10, 10), dtype=np.float32)
    w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    for algorithm in ("benchmark", 0, 1, 2):
        y = flux_dnn.conv2d(x, w, padding=1, algorithm=algorithm)
        np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    lines = (tmp_path / "cache" / "autotune.txt").read_text().splitlines()
    assert lines[0] == "flux_dnn autotune v1" and len(lines) == 2
    with pytest.raises(ValueError, match=r"algo_id 8 is not a oneDNN shim algorithm"):
        flux_dnn.conv2d(x, w, padding=1, algorithm=8)
    _core.set_autotune_path(saved)


def test_autotune_store_replays_choice_and_ignores_corrupt_files(rng, tmp_path):
    require_onednn()
    """A choice made by benchmark mode is read back by a new process (no new search), and a
    corrupt file is ignored with a warning, never trusted."""
    import subprocess
    import sys

    store = tmp_path / "autotune.txt"
    code = ("import numpy as np, flux_dnn\n"
            "x = np.ones((1, 8, 12, 12), np.float32); w = np.ones((8, 8, 3, 3), np.float32)\n"
            "y = flux_dnn.conv2d(x, w, padding=1, algorithm='benchmark')\n"
            "print(float(y[0, 0, 5, 5]))\n")
    env = {**__import__("os").environ, "FLUX_DNN_CACHE_DIR": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    store = tmp_path / "autotune-v1.txt"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    assert float(first.stdout) == 72.0
    lines = store.read_text().splitlines()
    assert lines[0] == "flux_dnn autotune v1" and len(lines) == 2
    key, algo = lines[1].split()
    # A hand-edited choice is what the next process uses: it replays it, and does not search.
    other = (int(algo) + 1) % 3
    store.write_text(f"flux_dnn autotune v1\n{key} {other}\n")
    check = code.replace("print(float(y[0, 0, 5, 5]))",
                         "print(flux_dnn.conv_plan(x, w, padding=1, algorithm='benchmark').algorithm)")
    second = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    assert ["(user layouts)", "(vendor weights)", "(vendor layouts)"][other] in second.stdout
    assert store.read_text().splitlines()[1] == f"{key} {other}"
    store.write_text("garbage\n")
    third = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, env=env,
                           timeout=120)
    assert third.returncode == 0 and float(third.stdout) == 72.0
    assert "ignoring autotune file" in third.stderr


def test_16bit_without_the_instruction_set_is_computed_in_float32():
    """float16 and bfloat16 on a CPU without AVX512-FP16 / AVX-512 (simulated by capping
    oneDNN's ISA at AVX2, so this runs the same on every x86-64 CPU): every op is computed in
    float32 inside the plan and rounded once, and the shim says so."""
    require_onednn()
    import subprocess
    import sys

    code = """if True:
        import numpy as np, torch, flux_dnn
        import reference as ref
        support = {s.name: s.dtype_support for s in flux_dnn.shims()}["onednn"]
        for name in ("float16", "bfloat16"):
            how, detail = support[name]
            assert how == "converted" and "instruction set avx2" in detail, (name, how, detail)
        rng = np.random.default_rng()
        x = rng.integers(-4, 5, (2, 8, 9, 7)) / 4
        w = rng.integers(-4, 5, (16, 4, 3, 3)) / 4
        b = rng.integers(-4, 5, (16,)) / 4
        geo = dict(stride=(2, 1), padding=((1, 0), (2, 1)), groups=2)
        rgeo = ((2, 1), (1, 2), (0, 1), (1, 1), 2)
        y = ref.conv_forward(x, w, b, *rgeo[:3], rgeo[3], rgeo[4])
        dy = rng.integers(-4, 5, y.shape) / 4
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
            t = lambda a: torch.from_numpy(a).to(dtype)
            out = flux_dnn.conv2d(t(x), t(w), t(b), activation="relu", **geo)
            np.testing.assert_allclose(out.double().numpy(), np.maximum(y, 0), rtol=tol, atol=tol * 8)
            dx = flux_dnn.conv_backward_data(t(dy), t(w), x.shape, **geo)
            np.testing.assert_allclose(dx.double().numpy(), ref.conv_backward_data(dy, w, x.shape, *rgeo),
                                       rtol=tol, atol=tol * 8)
            dw, db = flux_dnn.conv_backward_weight(t(x), t(dy), w.shape, bias_grad=True, **geo)
            np.testing.assert_allclose(dw.double().numpy(), ref.conv_backward_weight(x, dy, w.shape, *rgeo),
                                       rtol=tol, atol=tol * 16)
            np.testing.assert_allclose(db.double().numpy(), dy.sum(axis=(0, 2, 3)), rtol=tol, atol=tol * 16)
        print("ok")
    """
    env = {**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": "AVX2",
           "PYTHONPATH": __import__("os").path.dirname(__file__)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_views_with_gaps_and_accumulation(rng, dtype):
    """16-bit arrays whose elements leave gaps (sliced views), into an output with gaps that
    accumulates (beta): a shim that converts 16-bit data must follow the strides, read the
    old output once and write nothing between the elements."""
    require_cpu_dtype(dtype)
    big_x = grid(rng, (2, 6, 9, 14), dtype)
    x = big_x[:, ::2, :, ::2]  # (2, 3, 9, 7), gaps in C and W
    w = grid(rng, (4, 3, 3, 3), dtype)
    big_out = grid(rng, (2, 4, 9, 14), dtype)
    before = big_out.copy()
    out = big_out[:, :, :, 1::2]  # (2, 4, 9, 7), gaps in W
    existing = out.astype(np.float64)
    result = flux_dnn.conv2d(x, w, padding=1, alpha=0.5, beta=1.0, out=out)
    assert result is out
    expected = 0.5 * ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1)) + existing
    assert_close(out, expected, dtype)
    np.testing.assert_array_equal(big_out[:, :, :, 0::2].astype(np.float64), before[:, :, :, 0::2].astype(np.float64))
    dy = grid(rng, (2, 4, 9, 21), dtype)[:, :, :, ::3]  # gaps in the gradient too
    dw = flux_dnn.conv_backward_weight(x, dy, w.shape, padding=1)
    assert dw.dtype == x.dtype
    assert_close(dw, ref.conv_backward_weight(x, dy, w.shape, (1, 1), (1, 1), (1, 1)), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout_name", ["contiguous", "channels_last"])
def test_16bit_results_are_rounded_once(rng, dtype, layout_name):
    """Inputs whose float32 sums are exact but whose results need more bits than the 16-bit
    type has: the result must be the exact value rounded once to nearest even, as NumPy /
    ml_dtypes round float64; a second rounding (through float32 or the output dtype) or a
    16-bit accumulation would show."""
    require_cpu_dtype(dtype)
    nd = numpy_dtype(dtype)
    x = (rng.integers(-64, 65, (2, 5, 6, 7)) / 64).astype(nd)  # 7 significant bits: exact in bf16
    w = (rng.integers(-64, 65, (3, 5, 3, 3)) / 64).astype(nd)
    old = (rng.integers(-64, 65, (2, 3, 6, 7)) / 64).astype(nd)
    exact = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    y = flux_dnn.conv2d(layout(x, layout_name), w, padding=1)
    np.testing.assert_array_equal(y.astype(np.float64), exact.astype(nd).astype(np.float64))
    out = layout(old.copy(), layout_name)
    flux_dnn.conv2d(layout(x, layout_name), w, padding=1, beta=1.0, out=out)
    np.testing.assert_array_equal(out.astype(np.float64), (exact + old.astype(np.float64)).astype(nd).astype(np.float64))
    dw = flux_dnn.conv_backward_weight(layout(x, layout_name), layout(old, layout_name), w.shape, padding=1)
    np.testing.assert_array_equal(dw.astype(np.float64),
                                  ref.conv_backward_weight(x, old, w.shape, (1, 1), (1, 1), (1, 1)).astype(nd).astype(np.float64))

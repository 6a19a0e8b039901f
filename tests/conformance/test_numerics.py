"""What every backend must also get right beyond one call's values: the backward ops are the
vector-Jacobian products of forward; a 16-bit result is rounded once; strided views with gaps
are read and written element by element; the precision, determinism and workspace options;
streams other than the default; threads; a forked child; empty batches; a layer of realistic
size; the autotune store."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .conftest import DTYPES, RANKS
from .libraries import LAYOUTS, numpy_dtype, off_cpu, on_cpu, with_strides


def _float_dtype(backend, rng, *ops):
    """float32 where the shim claims it for every op, else float64; skips otherwise (these
    checks need a dtype whose rounding is far below their tolerance)."""
    for dtype in ("float32", "float64"):
        if all(dtype in backend.dtypes(op) for op in ops):
            return dtype
    pytest.skip(f"shim {backend.shim!r} claims neither float32 nor float64 for {', '.join(ops)}")


def _normal(rng, shape, dtype):
    """Standard normal values, rounded to dtype (as float64)."""
    return rng.standard_normal(shape).astype(dtype).astype(np.float64)


@pytest.mark.matrix(libraries="first", nd=RANKS)
def test_backward_ops_are_the_vjp_of_forward(backend, rng, nd):
    """<dy, d/dt f(x + t v)> by central differences of flux_dnn's forward equals <dx, v> from
    backward_data (and likewise in w): the backward ops are forward's vector-Jacobian products."""
    dtype = _float_dtype(backend, rng, "forward", "backward_data", "backward_weight")
    cap = backend.require("forward", dtype, nd)
    backend.require("backward_data", dtype, nd)
    backend.require("backward_weight", dtype, nd)
    g = P.draw("forward", rng, nd, str(rng.choice(P.PADDING_FORMS)), cap)
    x, w, dy = (_normal(rng, s, dtype) for s in (g.x_shape, g.w_shape, g.y_shape))
    vx, vw = _normal(rng, g.x_shape, dtype), _normal(rng, g.w_shape, dtype)
    h = 0.5  # forward is linear in each argument: differences are exact up to rounding
    lib, exact = backend.lib, dict(allow_reduced_precision=False)

    def f(xa, wa):  # (x + h v is rounded to dtype, as the shim sees it)
        return lib.numpy(
            flux_dnn.conv(lib.array(xa.astype(dtype), dtype), lib.array(wa.astype(dtype), dtype), **g.kwargs(), **exact)
        )

    fd_x = np.sum(dy * (f(x + h * vx, w) - f(x - h * vx, w))) / (2 * h)
    fd_w = np.sum(dy * (f(x, w + h * vw) - f(x, w - h * vw))) / (2 * h)
    dyd, wd = lib.array(dy, dtype), lib.array(w, dtype)
    dx = lib.numpy(flux_dnn.conv_backward_data(dyd, wd, g.x_shape, **g.kwargs(), **exact))
    dw = lib.numpy(flux_dnn.conv_backward_weight(lib.array(x, dtype), dyd, g.w_shape, **g.kwargs(), **exact))
    scale = np.sqrt(dy.size * g.C * np.prod(g.kernel))
    assert abs(np.sum(dx * vx) - fd_x) <= 1e-4 * scale * max(1.0, abs(fd_x) / scale), g
    assert abs(np.sum(dw * vw) - fd_w) <= 1e-4 * scale * max(1.0, abs(fd_w) / scale), g


@pytest.mark.matrix(libraries="first", dtype=DTYPES, layout=LAYOUTS)
def test_results_are_rounded_once(backend, rng, dtype, layout):
    """Inputs whose float32 sums are exact but whose results need more bits than a 16-bit type
    has: the result must be the exact value rounded once to nearest even, as NumPy and
    ml_dtypes round float64; a second rounding (through float32 or the output dtype) or a
    16-bit accumulation would show. (float32 and float64 results are exact here.)"""
    cap = backend.require("forward", dtype, 2, layout=layout)
    backend.require("backward_weight", dtype, 2, layout=layout)
    lib, nd_type = backend.lib, numpy_dtype(dtype)
    x = rng.integers(-64, 65, (2, 5, 6, 7)) / 64  # 7 significant bits: exact in bfloat16
    w = rng.integers(-64, 65, (3, 5, 3, 3)) / 64
    old = rng.integers(-64, 65, (2, 3, 6, 7)) / 64

    def once(v):
        return np.asarray(v).astype(nd_type).astype(np.float64)

    exact = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    xd = lib.array(x, dtype, layout)
    np.testing.assert_array_equal(lib.numpy(flux_dnn.conv2d(xd, lib.array(w, dtype), padding=1)), once(exact))
    if lib.writable and "alpha_beta" in cap.features:
        out = lib.array(old, dtype, layout)
        flux_dnn.conv2d(xd, lib.array(w, dtype), padding=1, beta=1.0, out=out)
        np.testing.assert_array_equal(lib.numpy(out), once(exact + old))
    dw = flux_dnn.conv_backward_weight(xd, lib.array(old, dtype, layout), w.shape, padding=1)
    np.testing.assert_array_equal(
        lib.numpy(dw), once(ref.conv_backward_weight(x, old, w.shape, (1, 1), (1, 1), (1, 1)))
    )


@pytest.mark.matrix(where=with_strides, dtype=DTYPES)
def test_views_with_gaps_and_accumulation(backend, rng, dtype):
    """Arrays whose elements leave gaps (sliced views), into an output with gaps that
    accumulates (beta): a shim must follow the strides, read the old output once and write
    nothing between the elements."""
    cap = backend.require("forward", dtype, 2, features=("alpha_beta",))
    backend.require("backward_weight", dtype, 2)
    backend.require("backward_data", dtype, 2)
    lib = backend.lib
    big_x = P.grid(rng, (2, 6, 9, 14))
    x = big_x[:, ::2, :, ::2]  # (2, 3, 9, 7), gaps in C and W
    w = P.grid(rng, (4, 3, 3, 3))
    big_out = P.grid(rng, (2, 4, 9, 14))
    xd, wd = lib.array(big_x, dtype)[:, ::2, :, ::2], lib.array(w, dtype)
    out_d = lib.array(big_out, dtype)
    view = out_d[:, :, :, 1::2]  # (2, 4, 9, 7), gaps in W
    result = flux_dnn.conv2d(xd, wd, padding=1, alpha=0.5, beta=1.0, out=view)
    assert result is view
    expected = 0.5 * ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1)) + big_out[:, :, :, 1::2]
    P.assert_close(lib, view, expected, dtype, "conv into a view", cap)
    np.testing.assert_array_equal(
        lib.numpy(out_d)[:, :, :, 0::2], big_out[:, :, :, 0::2], err_msg="elements between the output's were written"
    )
    big_dy = P.grid(rng, (2, 4, 9, 21))
    dy, dyd = big_dy[:, :, :, ::3], lib.array(big_dy, dtype)[:, :, :, ::3]  # gaps in the gradient too
    dw = flux_dnn.conv_backward_weight(xd, dyd, w.shape, padding=1)
    P.assert_close(
        lib,
        dw,
        ref.conv_backward_weight(x, dy, w.shape, (1, 1), (1, 1), (1, 1)),
        dtype,
        "conv_backward_weight of views",
        cap,
    )
    dx = flux_dnn.conv_backward_data(dyd, wd, x.shape, padding=1)
    P.assert_close(
        lib,
        dx,
        ref.conv_backward_data(dy, w, x.shape, (1, 1), (1, 1), (1, 1)),
        dtype,
        "conv_backward_data of a view",
        cap,
    )


@pytest.mark.matrix(libraries="first", algorithm=("heuristic", "benchmark"))
def test_precision_flags(backend, rng, algorithm):
    """float32 without reduced precision (and deterministic) is float32-exact on inputs
    that are not exact; with reduced precision allowed (TF32, bfloat16) it is close."""
    cap = backend.require("forward", "float32", 2)
    if algorithm == "benchmark":
        backend.require("forward", "float32", 2, features=("benchmark",))
    lib = backend.lib
    x, w = _normal(rng, (2, 16, 12, 12), "float32"), _normal(rng, (16, 16, 3, 3), "float32")
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    xd, wd = lib.array(x, "float32"), lib.array(w, "float32")
    exact = flux_dnn.conv2d(xd, wd, padding=1, deterministic=True, allow_reduced_precision=False, algorithm=algorithm)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(lib.numpy(exact), expected, rtol=2e-4, atol=2e-4 * scale, err_msg=str(cap))
    reduced = flux_dnn.conv2d(xd, wd, padding=1, allow_reduced_precision=True, algorithm=algorithm)
    np.testing.assert_allclose(lib.numpy(reduced), expected, rtol=3e-2, atol=3e-2 * scale, err_msg=str(cap))


@pytest.mark.matrix(libraries="first")
def test_deterministic_is_bitwise_reproducible(backend, rng):
    dtype = _float_dtype(backend, rng, "backward_weight")
    backend.require("backward_weight", dtype, 2, features=("deterministic",))
    lib = backend.lib
    x, dy = _normal(rng, (8, 16, 20, 20), dtype), _normal(rng, (8, 16, 20, 20), dtype)
    xd, dyd = lib.array(x, dtype), lib.array(dy, dtype)
    runs = [
        lib.numpy(flux_dnn.conv_backward_weight(xd, dyd, (16, 16, 3, 3), padding=1, deterministic=True))
        for _ in range(3)
    ]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


@pytest.mark.matrix(libraries="first", op=("forward", "backward_data", "backward_weight"))
def test_workspace_limit_zero_computes_or_is_refused(backend, rng, op):
    """With no workspace allowed a shim computes without one (cuDNN has such engines), or
    refuses the plan saying so: ABI 2.0 names FDNN_ERROR_UNSUPPORTED for a workspace beyond
    workspace_limit (ABI 1.2 names no code)."""
    dtype = backend.some_dtype(op, rng)
    cap = backend.require(op, dtype, 2)
    g = P.draw(op, rng, 2, str(rng.choice(P.PADDING_FORMS)), cap)
    refusals = (flux_dnn.UnsupportedError,)
    try:
        P.run_op(op, backend, rng, dtype, "contiguous", g, P.Epilogue(use_out=backend.lib.writable), workspace_limit=0)
    except refusals as exc:
        assert "workspace" in str(exc), exc


@pytest.mark.matrix(where=off_cpu)
def test_runs_on_the_current_non_default_stream(backend, rng):
    """Work is ordered on the stream current in the array's library, not the default one."""
    dtype = _float_dtype(backend, rng, "forward")
    backend.require("forward", dtype, 2)
    lib = backend.lib
    x, w, b = P.grid(rng, (4, 8, 32, 32)), P.grid(rng, (8, 8, 3, 3)), P.grid(rng, (8,))
    expected = ref.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1))
    stream = lib.stream()
    if stream is None:
        pytest.skip(f"{lib.name} gives no handle on its streams")
    with stream:
        xd, wd, bd = lib.array(x, dtype), lib.array(w, dtype), lib.array(b, dtype)
        results = [flux_dnn.conv(xd, wd, bd, padding=1) for _ in range(4)]
        got = [lib.numpy(r) for r in results]  # copies on the same stream, ordered after the conv
    lib.synchronize()
    for values in got:
        np.testing.assert_allclose(values, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


@pytest.mark.matrix(libraries="first")
def test_same_call_from_threads(backend, rng):
    """One cached plan and one conv_plan executed by several threads at once."""
    dtype = _float_dtype(backend, rng, "forward")
    backend.require("forward", dtype, 2)
    lib = backend.lib
    x, w = P.grid(rng, (4, 8, 16, 16)), P.grid(rng, (8, 8, 3, 3))
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    xd, wd = lib.array(x, dtype), lib.array(w, dtype)
    plan = flux_dnn.conv_plan(xd, wd, padding=1)
    calls = [lambda: flux_dnn.conv2d(xd, wd, padding=1), lambda: plan(xd)] * 8
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda call: lib.numpy(call()), calls))
    for values in results:
        np.testing.assert_allclose(values, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


@pytest.mark.matrix(libraries="first")
def test_empty_batch(backend, rng):
    """N = 0: empty results of the right shape; the weight gradient of no samples is zero, or
    beta times the old one when accumulating."""
    dtype = backend.some_dtype("backward_weight", rng)
    cap = backend.require("backward_weight", dtype, 2)
    backend.require("forward", dtype, 2)
    backend.require("backward_data", dtype, 2)
    lib = backend.lib
    x, w, dy = (
        lib.array(np.zeros((0, 4, 6, 6)), dtype),
        lib.array(P.grid(rng, (3, 4, 3, 3)), dtype),
        lib.array(np.zeros((0, 3, 4, 4)), dtype),
    )
    assert tuple(flux_dnn.conv2d(x, w).shape) == (0, 3, 4, 4)
    assert tuple(flux_dnn.conv_backward_data(dy, w, (0, 4, 6, 6)).shape) == (0, 4, 6, 6)
    assert tuple(flux_dnn.conv_transpose(dy, lib.array(P.grid(rng, (3, 4, 3, 3)), dtype)).shape) == (0, 4, 6, 6)
    dw = flux_dnn.conv_backward_weight(x, dy, (3, 4, 3, 3))
    np.testing.assert_array_equal(lib.numpy(dw), np.zeros((3, 4, 3, 3)))
    if lib.writable and "alpha_beta" in cap.features:
        old = P.grid(rng, (3, 4, 3, 3))
        out = lib.array(old, dtype)
        flux_dnn.conv_backward_weight(x, dy, (3, 4, 3, 3), beta=0.5, out=out)
        np.testing.assert_array_equal(lib.numpy(out), 0.5 * old)


@pytest.mark.matrix(libraries="first", layout=LAYOUTS)
def test_realistic_layer(backend, rng, layout):
    """A ResNet-sized layer: the blocking and threading that small problems never reach."""
    dtype = _float_dtype(backend, rng, "forward")
    backend.require("forward", dtype, 2, layout=layout)
    lib = backend.lib
    x, w, b = (
        _normal(rng, (2, 64, 28, 28), dtype),
        _normal(rng, (128, 64, 3, 3), dtype) * 0.125,
        _normal(rng, (128,), dtype),
    )
    expected = ref.conv_forward(x, w, b, (2, 2), (1, 1), (1, 1))
    xd, wd, bd = lib.array(x, dtype, layout), lib.array(w, dtype), lib.array(b, dtype)
    y = flux_dnn.conv2d(xd, wd, bd, stride=2, padding=1, allow_reduced_precision=False)  # (no TF32)
    np.testing.assert_allclose(lib.numpy(y), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())


# ------------------------------------------------------------------------------------------
# Autotune: a choice made by timing is stored, replayed, and a corrupt store is ignored


@pytest.fixture
def autotune_store(tmp_path):
    """A fresh autotune store for this test, and no cached plan that would skip the search."""
    from flux_dnn import _core

    saved = _core.autotune_path()
    _core.set_autotune_path(str(tmp_path / "cache" / "autotune.txt"))  # the directory is made
    flux_dnn.clear_plan_cache()
    yield tmp_path / "cache" / "autotune.txt"
    _core.set_autotune_path(saved)
    flux_dnn.clear_plan_cache()


def _stored(store) -> tuple:
    lines = store.read_text().splitlines()
    assert lines[0] == "flux_dnn autotune v1" and len(lines) == 2, lines
    key, algo = lines[1].split()
    return key, int(algo)


@pytest.mark.matrix(libraries="first")
def test_benchmark_choice_is_stored_and_given_ids_run(backend, rng, autotune_store):
    dtype = _float_dtype(backend, rng, "forward")
    backend.require("forward", dtype, 2, features=("benchmark",))
    lib = backend.lib
    x, w = P.grid(rng, (2, 8, 10, 10)), P.grid(rng, (8, 8, 3, 3))
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    xd, wd = lib.array(x, dtype), lib.array(w, dtype)
    P.assert_close(lib, flux_dnn.conv2d(xd, wd, padding=1, algorithm="benchmark"), expected, dtype, "benchmark", "")
    _, chosen = _stored(autotune_store)
    P.assert_close(lib, flux_dnn.conv2d(xd, wd, padding=1, algorithm=chosen), expected, dtype, "the chosen id", "")
    for algo in range(8):  # every small id the shim takes computes the same convolution
        try:
            y = flux_dnn.conv2d(xd, wd, padding=1, algorithm=algo)
        except (ValueError, flux_dnn.UnsupportedError):
            continue  # not an id of this shim, or not for this problem
        P.assert_close(lib, y, expected, dtype, f"algorithm {algo}", "")
    with pytest.raises(ValueError, match=r"algo[ _]id -1"):
        flux_dnn.conv2d(xd, wd, padding=1, algorithm=-1)


_AUTOTUNE_SCRIPT = """
import flux_dnn
x = {x}
w = {w}
if "{what}" == "value":
    print(float(flux_dnn.conv2d(x, w, padding=1, algorithm="benchmark")[0, 0, 5, 5]))
else:
    print(flux_dnn.conv_plan(x, w, padding=1, algorithm="benchmark").algorithm)
"""


@pytest.mark.matrix(libraries="first")
def test_autotune_store_replays_choice_and_ignores_corrupt_files(backend, rng, tmp_path):
    """A choice made by benchmark mode is read back by a new process (no new search): a
    hand-edited choice is what that process uses; a corrupt file is ignored with a warning,
    never trusted. Each process sees only this backend's shim (FLUX_DNN_SHIMS)."""
    dtype = _float_dtype(backend, rng, "forward")
    backend.require("forward", dtype, 2, features=("benchmark",))
    lib = backend.lib
    shape_x, shape_w = (1, 8, 12, 12), (8, 8, 3, 3)
    xd, wd = lib.array(np.ones(shape_x), dtype), lib.array(np.ones(shape_w), dtype)
    names = {}  # given algorithm id -> the plan's algorithm name, for the ids the shim takes
    for algo in range(8):
        try:
            names[algo] = flux_dnn.conv_plan(xd, wd, padding=1, algorithm=algo).algorithm
        except (ValueError, NotImplementedError, flux_dnn.UnsupportedError):
            pass
    env = {**os.environ, "FLUX_DNN_CACHE_DIR": str(tmp_path), "FLUX_DNN_SHIMS": backend.selector}
    env.pop("XDG_CACHE_HOME", None)

    def run(what, *flags):
        code = _AUTOTUNE_SCRIPT.format(x=lib.source(shape_x, dtype), w=lib.source(shape_w, dtype), what=what)
        done = subprocess.run(
            [sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done

    assert float(run("value").stdout) == 72.0
    store = tmp_path / "autotune-v1.txt"
    key, algo = _stored(store)
    others = [a for a, name in names.items() if name != names.get(algo)]
    if not others:
        pytest.skip(f"shim {backend.shim!r} takes no second algorithm among ids 0-7 for this problem")
    store.write_text(f"flux_dnn autotune v1\n{key} {others[0]}\n")
    assert run("name").stdout.strip() == names[others[0]]
    assert _stored(store) == (key, others[0])
    store.write_text("garbage\n")
    third = run("value", "-W", "always")
    assert float(third.stdout) == 72.0
    assert "ignoring autotune file" in third.stderr


_FORK_SCRIPT = r"""
import os, sys, time, warnings
import numpy as np
import flux_dnn

warnings.simplefilter("ignore", DeprecationWarning)  # "fork() in a multi-threaded process"
dtype = np.dtype(sys.argv[1])
rng = np.random.default_rng()
x = rng.integers(-4, 5, (8, 64, 32, 32)).astype(dtype) / 4   # 38 M multiply-adds: a full team
w = rng.integers(-4, 5, (64, 64, 3, 3)).astype(dtype) / 4
expected = flux_dnn.conv2d(x, w, padding=1)                   # the parent's threads are started

pid = os.fork()
if pid == 0:
    ok = False
    try:
        y = flux_dnn.conv2d(x, w, padding=1)                  # the cached plan
        dx = flux_dnn.conv_backward_data(y, w, x.shape, padding=1)  # a new plan in the child
        ok = bool(np.array_equal(y, expected)) and dx.shape == x.shape
    finally:
        os._exit(0 if ok else 3)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("hang")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
@pytest.mark.matrix(libraries="first", where=on_cpu)
def test_child_of_a_fork_computes(backend, rng):
    """A CPU shim whose thread pool does not survive fork() (GNU libgomp's, OpenBLAS's) must
    notice that it runs in a forked child and compute there instead of waiting forever."""
    dtype = _float_dtype(backend, rng, "forward", "backward_data")
    env = {**os.environ, "FLUX_DNN_SHIMS": backend.selector}
    result = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, dtype, "60"], capture_output=True, text=True, timeout=240, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exit", "0"], (result.stdout, result.stderr)

"""Checks that drive a vendor library's own environment switch, so that a path a machine
would not take by itself is taken on every machine. They name the vendor because the switch
is the vendor's; the shim is still the discovered one, pinned as everywhere in the suite."""

import os
import platform
import subprocess
import sys

import pytest

from .libraries import on_cpu

_CAPPED_ISA_SCRIPT = """if True:
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np, ml_dtypes, flux_dnn
    from flux_dnn import _core
    import reference as ref
    from conformance.conftest import shim_capabilities
    shim = _core.load_shim({{s.name: s for s in flux_dnn.shims()}}[{shim!r}].path)
    for name in ("float16", "bfloat16"):
        for op in (_core.CONV_FORWARD, _core.CONV_BACKWARD_DATA, _core.CONV_BACKWARD_WEIGHT):
            cap = shim_capabilities(shim, op, name)
            assert cap.support == "converted" and "instruction set avx2" in cap.detail, (name, op, cap)
    rng = np.random.default_rng()
    x = rng.integers(-4, 5, (2, 8, 9, 7)) / 4
    w = rng.integers(-4, 5, (16, 4, 3, 3)) / 4
    b = rng.integers(-4, 5, (16,)) / 4
    geo = dict(stride=(2, 1), padding=((1, 0), (2, 1)), groups=2)
    rgeo = ((2, 1), (1, 2), (0, 1), (1, 1), 2)
    y = ref.conv_forward(x, w, b, *rgeo)
    dy = rng.integers(-4, 5, y.shape) / 4
    for dtype, tol in ((np.float16, 2e-3), (ml_dtypes.bfloat16, 1e-2)):
        t = lambda a: a.astype(dtype)
        out = flux_dnn.conv2d(t(x), t(w), t(b), activation="relu", **geo)
        np.testing.assert_allclose(out.astype(float), np.maximum(y, 0), rtol=tol, atol=tol * 8)
        dx = flux_dnn.conv_backward_data(t(dy), t(w), x.shape, **geo)
        np.testing.assert_allclose(dx.astype(float), ref.conv_backward_data(dy, w, x.shape, *rgeo),
                                   rtol=tol, atol=tol * 8)
        dw, db = flux_dnn.conv_backward_weight(t(x), t(dy), w.shape, bias_grad=True, **geo)
        np.testing.assert_allclose(dw.astype(float), ref.conv_backward_weight(x, dy, w.shape, *rgeo),
                                   rtol=tol, atol=tol * 16)
        np.testing.assert_allclose(db.astype(float), dy.sum(axis=(0, 2, 3)), rtol=tol, atol=tol * 16)
    print("ok")
"""


@pytest.mark.matrix(libraries="first", where=on_cpu)
def test_16bit_without_the_instruction_set_is_computed_in_float32(backend):
    """float16 and bfloat16 on a CPU without AVX512-FP16 / AVX-512 BF16, simulated by capping
    oneDNN's instruction set at AVX2 (ONEDNN_MAX_CPU_ISA), so this runs alike on every x86-64
    CPU: every op is computed in float32 inside the plan and rounded once, and the shim says
    so in its dtype support."""
    if backend.status.vendor != "oneDNN":
        pytest.skip(f"ONEDNN_MAX_CPU_ISA is oneDNN's switch; shim {backend.shim!r} uses {backend.status.vendor}")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"ONEDNN_MAX_CPU_ISA=AVX2 caps x86-64 CPUs, not {platform.machine()}")
    pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 comes from ml_dtypes")
    code = _CAPPED_ISA_SCRIPT.format(tests=os.path.dirname(os.path.dirname(__file__)), shim=backend.shim)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "FLUX_DNN_SHIMS": backend.selector}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

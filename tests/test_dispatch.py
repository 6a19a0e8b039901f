"""Several shims for one device: a problem the first shim refuses when it makes its plan
(FDNN_ERROR_UNSUPPORTED) goes to the next, and the call is remembered with the shim that took
it; when every shim refuses, UnsupportedError lists what each said, and no output is touched.

The refusal is real: the BLAS shim's algorithm 4 (direct depthwise) refuses a convolution
with more than one input channel per group, which the oneDNN shim computes (its algorithm 4).
FLUX_DNN_SHIMS orders the shims, so each case runs in a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import cpu_shim_for

HERE = os.path.dirname(__file__)

PROLOGUE = """
import numpy as np
import flux_dnn
import reference as ref
from flux_dnn import _conv
from flux_dnn._discovery import REGISTRY

if not hasattr(REGISTRY, "candidates"):
    # Registry.candidates arrives with ABI 2.0 (the shims' own capabilities); until then the
    # registry's usable shims that compute the dtype, in its order, are the candidates.
    def candidates(device_type, dtype, device_id=0, argument="x", op=None):
        return [e for e in REGISTRY.usable_for(device_type)[0] if e.computes(dtype, device_id)]

    REGISTRY.candidates = candidates

rng = np.random.default_rng(7)
x = rng.standard_normal((2, 4, 7, 6), dtype=np.float32)
w = rng.standard_normal((5, 4, 3, 3), dtype=np.float32)
b = rng.standard_normal(5, dtype=np.float32)
expected = ref.conv_forward(x, w, b, (1, 1), (1, 1), (1, 1))
tolerance = dict(rtol=2e-4, atol=2e-4 * np.abs(expected).max())
"""


def run(shims: str, body: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLUX_DNN_SHIMS=shims, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    code = PROLOGUE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def both_cpu_shims():
    if cpu_shim_for("float32") is None:
        pytest.skip("no CPU shim computes float32 here")
    for name in ("blas", "onednn"):
        result = run(name, "")
        if result.returncode != 0:
            pytest.skip(f"the {name} shim does not load here: {result.stderr.strip().splitlines()[-1]}")


def test_refused_problem_goes_to_the_next_shim_and_is_remembered():
    result = run(
        "blas,onednn",
        """
        for _ in range(3):  # the first call is refused by blas; the memo then names onednn
            out = np.full(expected.shape, np.nan, np.float32)
            assert flux_dnn.conv2d(x, w, b, padding=1, algorithm=4, out=out) is out
            np.testing.assert_allclose(out, expected, **tolerance)
        (prepared,) = _conv._memo.values()
        assert prepared.shim.name == "onednn", prepared.shim.name
        plan = flux_dnn.conv_plan(x, w, b, padding=1, algorithm=4)
        np.testing.assert_allclose(plan(x), expected, **tolerance)
        print("ok")
        """,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_every_shim_refusing_names_each_and_writes_nothing():
    result = run(
        "blas",
        """
        out = np.full(expected.shape, 3.0, np.float32)
        try:
            flux_dnn.conv2d(x, w, b, padding=1, algorithm=4, out=out)
        except flux_dnn.UnsupportedError as error:
            print(error)
        assert (out == 3.0).all(), "a refused call wrote its output"
        try:
            flux_dnn.conv_plan(x, w, b, padding=1, algorithm=4)
        except flux_dnn.UnsupportedError as error:
            print(error)
        """,
    )
    assert result.returncode == 0, result.stderr
    messages = result.stdout.split("no shim for CPU arrays can compute this convolution:")
    assert len(messages) == 3, result.stdout  # conv2d's and conv_plan's
    for message in messages[1:]:
        assert "shim 'blas':" in message and "needs one input channel per group" in message, message

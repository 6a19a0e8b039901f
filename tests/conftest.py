import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def rng(request):
    """A fresh random generator per test; its seed is printed when the test fails, and
    FLUX_DNN_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get("FLUX_DNN_TEST_SEED") or np.random.SeedSequence().entropy)
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


# The CPU conformance tests run in every dtype of the ABI, on whichever CPU shim serves it
# here (FLUX_DNN_SHIMS=blas forces the BLAS shim for all of them); a dtype no shim computes
# is skipped with the reason.
DTYPES = ["float64", "float32", "float16", "bfloat16"]


def numpy_dtype(name):
    """The NumPy dtype of an ABI dtype name (bfloat16 is ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def cpu_shim_for(dtype: str):
    """Name of the CPU shim that computes `dtype` here, or None."""
    from flux_dnn._discovery import REGISTRY

    try:
        return REGISTRY.shim_for(1, dtype).name
    except Exception:
        return None


def require_cpu_dtype(dtype: str) -> str:
    shim = cpu_shim_for(dtype)
    if shim is None:
        pytest.skip(f"no CPU shim here computes {dtype} (see python -m flux_dnn info)")
    return shim


def require_onednn():
    """For tests of the oneDNN shim's own behaviour (its algorithm ids, names, ISA)."""
    if cpu_shim_for("float32") != "onednn":
        pytest.skip("the oneDNN shim does not serve float32 here (not installed, or FLUX_DNN_SHIMS names others)")

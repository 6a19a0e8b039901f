import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Shims never run on their vendor's hardware (MIOpen on its test double here) warn once on
# first use; the suites exercise them on purpose (test_shims checks the warning itself).
os.environ.setdefault("FLUX_DNN_UNVERIFIED_WARNING", "0")

#: The base of the fixed seeds of a GPU run (FLUX_DNN_TEST_SEED_BASE overrides it).
GPU_SEED_BASE = 20261203


def _gpu_run(config) -> bool:
    """A run on a lent GPU (scripts/gpu_check.sh sets FLUX_DNN_GPU_RUN=1, or -m accelerator):
    its minutes are few, so a failure must reproduce on the rerun, not depend on entropy."""
    return os.environ.get("FLUX_DNN_GPU_RUN") == "1" or "accelerator" in (config.option.markexpr or "")


def _seed_base(config) -> int | None:
    """The base of per-test fixed seeds, or None for fresh entropy per test (CPU runs: each CI
    run draws new cases)."""
    if os.environ.get("FLUX_DNN_TEST_SEED_BASE"):
        return int(os.environ["FLUX_DNN_TEST_SEED_BASE"])
    return GPU_SEED_BASE if _gpu_run(config) else None


# Linux aarch64 (issue 24): .ci/aarch64.sh runs `pytest -m aarch64` in an arm64 Debian root
# under qemu-user emulation, where the build takes minutes and Python runs many times slower.
# These files (or folders) of tests/ get the marker: what .ci/run runs on its build without
# oneDNN (the CPU conformance suite, there on the BLAS shim, the only CPU shim of the aarch64
# wheel; the NumPy, float64, plan and error tests; the ABI suite), the BLAS shim's own tests
# (its portable kernels: no AVX2/F16C copies on aarch64; its threads) and what info and the
# demo say.
AARCH64_TESTS = (
    "conformance",
    "abi",
    "test_forward.py",
    "test_numpy_dtypes.py",
    "test_float64.py",
    "test_plan.py",
    "test_errors.py",
    "test_blas_shim.py",
    "test_blas_threads.py",
    "test_platform_truth.py",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "aarch64: run on Linux aarch64 under emulation (.ci/aarch64.sh); tests/conftest.py's AARCH64_TESTS"
    )


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        relative = os.path.relpath(str(item.path), here).split(os.sep)
        if relative[0] in AARCH64_TESTS:
            item.add_marker(pytest.mark.aarch64)


def pytest_report_header(config):
    if os.environ.get("FLUX_DNN_TEST_SEED"):
        return f"flux_dnn random seed: {os.environ['FLUX_DNN_TEST_SEED']} for every test (FLUX_DNN_TEST_SEED)"
    base = _seed_base(config)
    if base is None:
        return "flux_dnn random seeds: fresh per test, printed with a failure (FLUX_DNN_TEST_SEED=<seed> replays one)"
    return (
        f"flux_dnn random seeds: fixed, from base {base} and each test's id (FLUX_DNN_TEST_SEED_BASE=<n> "
        "changes the base; FLUX_DNN_TEST_SEED=<seed> replays one test's printed seed)"
    )


@pytest.fixture
def rng(request):
    """A fresh random generator per test; its seed is printed (shown when the test fails, and
    in the junit file), and FLUX_DNN_TEST_SEED=<seed> replays it. On a GPU run the seed is
    fixed per test (its id and a base), so a rerun draws the same cases."""
    base = _seed_base(request.config)
    if os.environ.get("FLUX_DNN_TEST_SEED"):
        seed = int(os.environ["FLUX_DNN_TEST_SEED"])
    elif base is not None:
        seed = base * 2**32 + zlib.crc32(request.node.nodeid.encode())
    else:
        seed = int(np.random.SeedSequence().entropy)
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

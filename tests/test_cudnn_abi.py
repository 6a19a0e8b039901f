"""The cuDNN shim's own C ABI behaviour, driven directly through ctypes (below the core).

Runs everywhere the shim is built: without a GPU it checks what only this shim does (its
cuDNN version, no exports but the entry point, the no-GPU reason and errors, cuDNN found
without a preload); with a CUDA device it also plans real convolutions (algorithm ids,
flags, workspace limit, capabilities per compute capability). What every shim owes the
header is in test_shim_abi.py (FLUX_DNN_CUDNN_SHIM puts this shim there too); the
conformance of the numbers is in tests/conformance/ (its CUDA backends).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import fdnn_ctypes as F
from fdnn_ctypes import ABI, DeviceDescribeArgs, Shim, ShimInfoArgs, conv_args, new, tensor


def _shim_library() -> str | None:
    path = os.environ.get("FLUX_DNN_CUDNN_SHIM")
    if path:
        return path
    for package in ("flux_dnn_cuda13", "flux_dnn_cuda12"):
        try:
            module = __import__(package)
        except ImportError:
            continue
        return str(module.LIBRARY)
    return None


LIBRARY = _shim_library()
pytestmark = pytest.mark.skipif(
    LIBRARY is None,
    reason="cudnn shim not installed: pip install packaging/flux-dnn-cuda13 "
           "(or set FLUX_DNN_CUDNN_SHIM to libflux_dnn_cudnn.so)")


@pytest.fixture(scope="module")
def shim() -> Shim:
    # What the wheel's entry point does before the core loads the shim: load cuDNN from the
    # nvidia-cudnn-cu* wheel. Without it the shim must still load and explain itself.
    F.preload_vendor_libraries()
    return Shim(LIBRARY)


@pytest.fixture(scope="module")
def info(shim) -> ShimInfoArgs:
    return shim.info()


def has_device(info) -> bool:
    return info.unavailable_reason is None and info.num_devices > 0


def test_table_is_the_headers_abi_without_packing(shim):
    api = shim.api
    assert (api.abi_major, api.abi_minor) == (ABI.ABI_MAJOR, ABI.ABI_MINOR)
    assert api.Conv_Capabilities
    assert not api.Conv_Plan_Pack_Weights  # cuDNN reads w as it is: nothing to pack


def test_only_the_entry_point_is_exported(shim):
    for private in ("cudaMalloc", "cudaGetDeviceCount", "launch_bias_activation"):
        assert not hasattr(shim.lib, private), f"{private} leaks out of the shim"


def test_info_names_cudnn_and_its_versions(info):
    assert info.shim_name == b"cudnn"
    assert info.vendor_name == b"cuDNN"
    assert info.device_type == ABI.DEVICE_CUDA
    assert info.priority == ABI.PRIORITY_VENDOR
    assert info.shim_version.decode() == F.flux_dnn_version()
    assert re.fullmatch(rb"9\.\d+\.\d+", info.vendor_version_built)
    # The nvidia-cudnn-cu13 wheel is a dependency of the shim's wheel: it must be found.
    assert re.fullmatch(rb"9\.\d+\.\d+", info.vendor_version_runtime), info.unavailable_reason


def test_info_says_why_not_without_a_gpu(info):
    if has_device(info):
        pytest.skip("a CUDA device is present")
    assert info.num_devices == 0
    reason = info.unavailable_reason.decode()
    assert ("no NVIDIA driver found" in reason or "no CUDA device" in reason
            or "driver is too old" in reason), reason


def test_finds_cudnn_without_preload_or_library_path():
    """A fresh process, no preload, no LD_LIBRARY_PATH: the shim finds the cuDNN wheel
    installed beside it (site-packages/nvidia/cudnn/lib)."""
    if "site-packages" not in LIBRARY:
        pytest.skip("shim not installed from its wheel")
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from fdnn_ctypes import Shim; "
            "print(Shim(sys.argv[1]).info().vendor_version_runtime.decode())")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", code, LIBRARY, os.path.dirname(__file__)],
                         capture_output=True, text=True, env=env, check=True)
    assert re.fullmatch(r"9\.\d+\.\d+", out.stdout.strip()), out


def _small_problem(**kw):
    x, w, y = tensor([2, 4, 8, 8]), tensor([6, 4, 3, 3]), tensor([2, 6, 8, 8])
    args = conv_args(x, w, y, padding=1, **kw)
    args._keep = (x, w, y)
    return args


def test_plan_without_gpu_is_unavailable_with_the_reason(shim, info):
    if has_device(info):
        pytest.skip("a CUDA device is present")
    code, message = shim.call("Conv_Plan_Create", _small_problem())
    assert code == "UNAVAILABLE"
    assert info.unavailable_reason.decode() in message


def test_device_describe_without_gpu_is_unavailable(shim, info):
    if has_device(info):
        pytest.skip("a CUDA device is present")
    args = new(DeviceDescribeArgs, device_id=0)
    code, message = shim.call("Device_Describe", args)
    assert code == "UNAVAILABLE" and info.unavailable_reason.decode() in message


def test_capabilities_without_gpu_are_unavailable(shim, info):
    if has_device(info):
        pytest.skip("a CUDA device is present")
    error = shim.capabilities(ABI.CONV_FORWARD, F.DTYPES["float32"])
    assert isinstance(error, tuple) and error[0] == "UNAVAILABLE", error
    assert info.unavailable_reason.decode() in error[1]


# ---- with a CUDA device ----------------------------------------------------------------

def _gpu(info):
    if not has_device(info):
        pytest.skip(f"no CUDA device: {info.unavailable_reason.decode()}")


def _plan(shim, args):
    error = shim.call("Conv_Plan_Create", args)
    assert error is None, error
    result = (args.workspace_size, args.chosen_algo_id, args.algo_name.decode())
    shim.destroy(args.plan)
    return result


def _compute_capability(shim) -> int:
    args = new(DeviceDescribeArgs, device_id=0)
    assert shim.call("Device_Describe", args) is None
    return int(re.search(rb"\(sm_(\d+)\)$", args.name).group(1))


def test_device_name_has_the_sm_version_and_tf32_is_the_default(shim, info):
    _gpu(info)
    args = new(DeviceDescribeArgs, device_id=0)
    assert shim.call("Device_Describe", args) is None
    assert re.search(rb"\(sm_\d+\)$", args.name), args.name
    assert args.default_flags == ABI.CONV_ALLOW_REDUCED_PRECISION


@pytest.mark.parametrize("dtype", sorted(F.DTYPES))
def test_capabilities_follow_the_compute_capability(shim, info, dtype):
    """bfloat16 and TF32 from sm_80 on; everything else on every GPU cuDNN 9 serves."""
    _gpu(info)
    ampere = _compute_capability(shim) >= 80
    caps = shim.capabilities(ABI.CONV_FORWARD, F.DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    computed = dtype != "bfloat16" or ampere
    assert caps.support == (ABI.SUPPORT_NATIVE if computed else ABI.SUPPORT_NONE), caps.detail
    reduced = dtype in ("float16", "bfloat16") or (dtype == "float32" and ampere)
    assert bool(caps.features & ABI.FEATURE_REDUCED_PRECISION) == (reduced and computed)


OPS = (ABI.CONV_FORWARD, ABI.CONV_BACKWARD_DATA, ABI.CONV_BACKWARD_WEIGHT)


@pytest.mark.parametrize("op", OPS)
def test_given_id_reproduces_the_choice(shim, info, op):
    _gpu(info)
    for policy in (ABI.ALGO_HEURISTIC, ABI.ALGO_BENCHMARK):
        ws, algo, name = _plan(shim, _with(op, policy=policy))
        ws2, algo2, name2 = _plan(shim, _with(op, policy=ABI.ALGO_GIVEN, algo_id=algo))
        assert algo2 == algo and ws2 == ws
        assert name2.split(" (")[0] == name.split(" (")[0]


def _with(op, **fields):
    args = _small_problem(op=op)
    for k, v in fields.items():
        setattr(args, {"policy": "algo_policy"}.get(k, k), v)
    return args


def test_stale_algo_id_is_refused(shim, info):
    _gpu(info)
    code, message = shim.call("Conv_Plan_Create", _with(ABI.CONV_FORWARD, policy=ABI.ALGO_GIVEN,
                                                        algo_id=(9999 << 16) | 0))
    assert code == "INVALID_ARGUMENT" and "algo id" in message and "conv2d" in message


def test_workspace_limit_zero_is_honoured(shim, info):
    _gpu(info)
    ws, _, _ = _plan(shim, _with(ABI.CONV_FORWARD, workspace_limit=0))
    assert ws == 0


def test_deterministic_excludes_nondeterministic_engines(shim, info):
    _gpu(info)
    for op in OPS:
        _, _, name = _plan(shim, _with(op, flags=ABI.CONV_DETERMINISTIC, policy=ABI.ALGO_BENCHMARK))
        assert "nondeterministic" not in name


def test_fp32_without_reduced_precision_avoids_tensor_cores(shim, info):
    _gpu(info)
    _, _, name = _plan(shim, _with(ABI.CONV_FORWARD, flags=0))
    assert "tensor-core" not in name


def test_bad_shape_names_the_parameters(shim, info):
    _gpu(info)
    x, w, y = tensor([2, 4, 8, 8]), tensor([6, 4, 3, 3]), tensor([2, 6, 7, 7])
    args = conv_args(x, w, y, padding=1)
    code, message = shim.call("Conv_Plan_Create", args)
    assert code == "INVALID_ARGUMENT"
    assert "spatial dim 0 of y is 7" in message and "x=[2,4,8,8]" in message

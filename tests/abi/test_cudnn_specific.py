"""What only the cuDNN shim does, through its C table with ctypes (below the core).

What every shim owes the header, the cuDNN shim included (with a GPU or without: then it
must load and say why not), is in test_abi.py. Here: its names and cuDNN versions, its
no-GPU reason, cuDNN found beside it without a preload; with a CUDA device, real plans
(algorithm ids, flags, workspace limit, capabilities per compute capability). The numbers it
computes are the conformance suite's."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from . import fdnn_ctypes as F
from .fdnn_ctypes import ABI, DeviceDescribeArgs, Shim, ShimInfoArgs, conv_args, new, tensor
from .shims import open_shim

OPS = (ABI.CONV_FORWARD, ABI.CONV_BACKWARD_DATA, ABI.CONV_BACKWARD_WEIGHT)


@pytest.fixture(scope="module")
def cudnn(tmp_path_factory) -> Shim:
    return open_shim("cudnn", tmp_path_factory)


@pytest.fixture(scope="module")
def info(cudnn) -> ShimInfoArgs:
    return cudnn.info()


def has_device(info) -> bool:
    return info.unavailable_reason is None and info.num_devices > 0


def test_cudnn_reads_weights_as_they_are(cudnn):
    assert not cudnn.api.Conv_Plan_Pack_Weights  # nothing to pack


def test_info_names_cudnn_and_its_versions(info):
    assert (info.shim_name, info.vendor_name) == (b"cudnn", b"cuDNN")
    assert info.device_type == ABI.DEVICE_CUDA
    assert info.priority == ABI.PRIORITY_VENDOR
    assert re.fullmatch(rb"9\.\d+\.\d+", info.vendor_version_built)
    # The nvidia-cudnn-cu13 wheel is a dependency of the shim's wheel: it must be found.
    assert re.fullmatch(rb"9\.\d+\.\d+", info.vendor_version_runtime), info.unavailable_reason


def test_info_says_why_not_without_a_gpu(info):
    if has_device(info):
        pytest.skip("a CUDA device is present")
    reason = info.unavailable_reason.decode()
    assert "no NVIDIA driver found" in reason or "no CUDA device" in reason or "driver is too old" in reason, reason


def test_finds_cudnn_without_preload_or_library_path(cudnn):
    """A fresh process, no preload, no LD_LIBRARY_PATH: the shim finds the cuDNN wheel
    installed beside it (site-packages/nvidia/cudnn/lib)."""
    if "site-packages" not in cudnn.path:
        pytest.skip("shim not installed from its wheel")
    tests = pathlib.Path(__file__).resolve().parent.parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); from abi.fdnn_ctypes import Shim; "
        "print(Shim(sys.argv[1]).info().vendor_version_runtime.decode())"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, cudnn.path, str(tests)], capture_output=True, text=True, env=env, check=True
    )
    assert re.fullmatch(r"9\.\d+\.\d+", out.stdout.strip()), out


# ---- with a CUDA device ----------------------------------------------------------------


def _gpu(info):
    if not has_device(info):
        pytest.skip(f"no CUDA device: {info.unavailable_reason.decode()}")


def _small_problem(**kw):
    x, w, y = tensor([2, 4, 8, 8]), tensor([6, 4, 3, 3]), tensor([2, 6, 8, 8])
    return conv_args(x, w, y, padding=1, **kw)


def _with(op, **fields):
    args = _small_problem(op=op)
    for k, v in fields.items():
        setattr(args, {"policy": "algo_policy"}.get(k, k), v)
    return args


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


def test_device_name_has_the_sm_version(cudnn, info):
    _gpu(info)
    args = new(DeviceDescribeArgs, device_id=0)
    assert cudnn.call("Device_Describe", args) is None
    assert re.search(rb"\(sm_\d+\)$", args.name), args.name


@pytest.mark.parametrize("dtype", sorted(F.DTYPES))
def test_capabilities_follow_the_compute_capability(cudnn, info, dtype):
    """bfloat16 and TF32 from sm_80 on; everything else on every GPU cuDNN 9 serves."""
    _gpu(info)
    ampere = _compute_capability(cudnn) >= 80
    caps = cudnn.capabilities(ABI.CONV_FORWARD, F.DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    computed = dtype != "bfloat16" or ampere
    assert caps.support == (ABI.SUPPORT_NATIVE if computed else ABI.SUPPORT_NONE), caps.detail
    reduced = dtype in ("float16", "bfloat16") or (dtype == "float32" and ampere)
    assert bool(caps.features & ABI.FEATURE_REDUCED_PRECISION) == (reduced and computed)


@pytest.mark.parametrize("op", OPS)
def test_given_id_reproduces_the_choice(cudnn, info, op):
    _gpu(info)
    for policy in (ABI.ALGO_HEURISTIC, ABI.ALGO_BENCHMARK):
        ws, algo, name = _plan(cudnn, _with(op, policy=policy))
        ws2, algo2, name2 = _plan(cudnn, _with(op, policy=ABI.ALGO_GIVEN, algo_id=algo))
        assert algo2 == algo and ws2 == ws
        assert name2.split(" (")[0] == name.split(" (")[0]


def test_stale_algo_id_is_refused(cudnn, info):
    _gpu(info)
    code, message = cudnn.call(
        "Conv_Plan_Create", _with(ABI.CONV_FORWARD, policy=ABI.ALGO_GIVEN, algo_id=(9999 << 16) | 0)
    )
    assert code == "INVALID_ARGUMENT" and "algo id" in message and "conv2d" in message


def test_workspace_limit_zero_is_honoured(cudnn, info):
    _gpu(info)
    ws, _, _ = _plan(cudnn, _with(ABI.CONV_FORWARD, workspace_limit=0))
    assert ws == 0


def test_deterministic_excludes_nondeterministic_engines(cudnn, info):
    _gpu(info)
    for op in OPS:
        _, _, name = _plan(cudnn, _with(op, flags=ABI.CONV_DETERMINISTIC, policy=ABI.ALGO_BENCHMARK))
        assert "nondeterministic" not in name


def test_fp32_without_reduced_precision_avoids_tensor_cores(cudnn, info):
    _gpu(info)
    _, _, name = _plan(cudnn, _with(ABI.CONV_FORWARD, flags=0))
    assert "tensor-core" not in name


def test_bad_shape_names_the_parameters(cudnn, info):
    _gpu(info)
    x, w, y = tensor([2, 4, 8, 8]), tensor([6, 4, 3, 3]), tensor([2, 6, 7, 7])
    code, message = cudnn.call("Conv_Plan_Create", conv_args(x, w, y, padding=1))
    assert code == "INVALID_ARGUMENT"
    assert "spatial dim 0 of y is 7" in message and "x=[2,4,8,8]" in message


# ---- cuDNN's companions: cuBLASLt and NVRTC ----------------------------------------------


def _companions() -> dict:
    """soname -> the wheel of NVIDIA's that installed it here (CUDA 13 names), where present."""
    import importlib.metadata

    found = {}
    for distribution, soname in (("nvidia-cublas", "libcublasLt.so.13"), ("nvidia-cuda-nvrtc", "libnvrtc.so.13")):
        try:
            files = importlib.metadata.distribution(distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        if any(f.name == soname for f in files):
            found[soname] = distribution
    return found


def test_loads_cublaslt_and_nvrtc_beside_it_without_preload(cudnn):
    """cuDNN dlopens cuBLASLt and NVRTC by soname for some engines; NVIDIA's wheels keep them
    off the library path. In a fresh process without any preload (a C caller, or a CuPy-only
    process), loading cuDNN through the shim must load them too, from the wheels beside it."""
    if "site-packages" not in cudnn.path:
        pytest.skip("shim not installed from its wheel")
    wanted = _companions()
    if not wanted:
        pytest.skip("neither nvidia-cublas nor nvidia-cuda-nvrtc is installed")
    tests = pathlib.Path(__file__).resolve().parent.parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); from abi.fdnn_ctypes import Shim; "
        "Shim(sys.argv[1]).info(); print(open('/proc/self/maps').read())"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    maps = subprocess.run(
        [sys.executable, "-c", code, cudnn.path, str(tests)], capture_output=True, text=True, env=env, check=True
    ).stdout
    for soname in wanted:
        assert soname in maps, f"{soname} not loaded after cuDNN was"


# ---- plans on a device: workspace limits, fusion ------------------------------------------


def _channels_last(shape, dtype="float32", data=None):
    """An N, C, *spatial tensor with channels-last strides."""
    n, c, *spatial = shape
    strides, acc = {}, c
    for i in reversed(range(len(spatial))):
        strides[i + 2], acc = acc, acc * spatial[i]
    full = [acc, 1, *(strides[i + 2] for i in range(len(spatial)))]
    return tensor(shape, F.DTYPES[dtype], strides=full, data=data)


def _staged_problem(op=ABI.CONV_FORWARD, dtype="float32"):
    """Channels-last x and y with a w in the other order: the shim copies w into x's order in
    its workspace, unless the limit leaves no room."""
    x, y = _channels_last([4, 16, 12, 12], dtype), _channels_last([4, 32, 12, 12], dtype)
    w = tensor([32, 16, 3, 3], F.DTYPES[dtype])
    return conv_args(x, w, y, op=op, padding=1)


def _try_plan(shim, args):
    error = shim.call("Conv_Plan_Create", args)
    if error is not None:
        return error
    result = args.workspace_size
    shim.destroy(args.plan)
    return result


@pytest.mark.parametrize("op", OPS)
def test_workspace_never_exceeds_the_limit(cudnn, info, op):
    """At every limit from the unlimited plan's workspace down to 0 (and around 256-byte
    steps), a plan fits its limit, or is refused as UNSUPPORTED naming the workspace."""
    _gpu(info)
    unlimited = _try_plan(cudnn, _staged_problem(op))
    assert isinstance(unlimited, int), unlimited
    limits = sorted({unlimited, unlimited - 1, unlimited - 255, unlimited - 256, unlimited // 2, 4096, 255, 1, 0})
    for limit in (v for v in limits if v >= 0):
        args = _staged_problem(op)
        args.workspace_limit = limit
        got = _try_plan(cudnn, args)
        if isinstance(got, tuple):
            assert got[0] == "UNSUPPORTED" and "workspace" in got[1], (limit, got)
        else:
            assert got <= limit, f"workspace_size {got} over workspace_limit {limit}"


@pytest.mark.parametrize("op", OPS)
def test_limit_zero_plans_without_staging_w(cudnn, info, op):
    """The core's fallback when the array library refuses workspace is a plan at limit 0: a
    channels-last x with a w in the other order must still plan (w given to cuDNN as it is)."""
    _gpu(info)
    args = _staged_problem(op)
    args.workspace_limit = 0
    assert _try_plan(cudnn, args) == 0


def _with_epilogue(activation, beta, limit):
    x, w, y = tensor([2, 8, 10, 10]), tensor([16, 8, 3, 3]), tensor([2, 16, 10, 10])
    args = conv_args(x, w, y, padding=1, bias=tensor([16]))
    args.activation, args.beta, args.workspace_limit = activation, beta, limit
    return args


def test_bias_with_beta_needs_no_workspace_of_ours(cudnn, info):
    """y = alpha * conv + beta * y_old is cuDNN's own scaling; the bias is added in place."""
    _gpu(info)
    assert _try_plan(cudnn, _with_epilogue(ABI.ACTIVATION_NONE, 0.5, 0)) == 0


def test_activation_with_beta_at_limit_zero_is_refused_naming_the_workspace(cudnn, info):
    """act(conv) + beta * y_old needs the conv result apart from y: no plan without workspace."""
    _gpu(info)
    got = _try_plan(cudnn, _with_epilogue(ABI.ACTIVATION_RELU, 0.5, 0))
    assert isinstance(got, tuple) and got[0] == "UNSUPPORTED" and "workspace" in got[1], got
    assert isinstance(_try_plan(cudnn, _with_epilogue(ABI.ACTIVATION_RELU, 0.5, 1 << 20)), int)


def test_nhwc_float16_bias_relu_is_fused(cudnn, info):
    """The case cuDNN's runtime fusion engines exist for (and PyTorch fuses): conv + bias +
    ReLU, NHWC, float16, alpha 1, beta 0. If it is not fused, the fused graph was refused (the
    ReLU attributes, the virtual tensors...): results stay right, so only this test notices."""
    _gpu(info)
    x, y = _channels_last([8, 64, 28, 28], "float16"), _channels_last([8, 64, 28, 28], "float16")
    w = _channels_last([64, 64, 3, 3], "float16")
    for policy in (ABI.ALGO_HEURISTIC, ABI.ALGO_BENCHMARK):
        args = conv_args(x, w, y, padding=1, bias=tensor([64], F.DTYPES["float16"]))
        args.activation, args.algo_policy = ABI.ACTIVATION_RELU, policy
        _, algo, name = _plan(cudnn, args)
        fused = bool((algo >> 40) & 1)
        assert fused == ("fused" in name), name
        # (benchmark times the fused graph against conv + our epilogue and may keep either)
        assert fused or policy == ABI.ALGO_BENCHMARK, f"not fused: {name}"


# ---- the staged problem: asymmetric padding, gaps, repeated elements ----------------------


def _asymmetric_problem(op, batch_stride=None):
    """x (2, 4, 9, 9), w (6, 4, 3, 3), padding pre (2, 0) / post (0, 1): y (2, 6, 9, 8). With
    batch_stride 0, the operand the op only reads (x, or dy for backward-data) repeats one
    image (stride 0, as torch's expand gives): cuDNN cannot take it, so the shim plans the
    staged problem straight away, which pads x in a copy."""
    x_strides = [324, 81, 9, 1]
    y_strides = [432, 72, 8, 1]
    if batch_stride is not None:
        (y_strides if op == ABI.CONV_BACKWARD_DATA else x_strides)[0] = batch_stride
    x = tensor([2, 4, 9, 9], strides=x_strides)
    w, y = tensor([6, 4, 3, 3]), tensor([2, 6, 9, 8], strides=y_strides)
    args = conv_args(x, w, y, op=op)
    args.padding_lo[0], args.padding_hi[0] = 2, 0
    args.padding_lo[1], args.padding_hi[1] = 0, 1
    return args


@pytest.mark.parametrize("op", OPS)
def test_asymmetric_padding_plans_on_every_op(cudnn, info, op):
    """pre != post padding plans on every op: by cuDNN's own pre/post paddings, or, where it
    has no engine for them, by a padded copy in the workspace that the name and id show."""
    _gpu(info)
    ws, algo, name = _plan(cudnn, _asymmetric_problem(op))
    staged = bool(algo & (1 << 41))
    assert staged == ("padded copy" in name), name
    padded_x = 2 * 4 * 11 * 10 * 4
    assert not staged or ws >= padded_x, (ws, name)


@pytest.mark.parametrize("op", OPS)
def test_repeated_operand_plans_the_padded_copy(cudnn, info, op):
    """A repeated (stride 0) operand goes straight to the staged problem: its name says which
    copies run, bit 41 of its id says so too, the given id plans the same, and the workspace
    holds the padded x (or dx) besides cuDNN's; a limit that cannot hold the copies is refused
    as UNSUPPORTED naming the workspace."""
    _gpu(info)
    ws, algo, name = _plan(cudnn, _asymmetric_problem(op, batch_stride=0))
    assert algo & (1 << 41), (hex(algo), name)
    assert "padded copy" in name, name
    assert op != ABI.CONV_BACKWARD_DATA or "dy (compact copy)" in name, name
    padded_x = 2 * 4 * 11 * 10 * 4  # the padded x or dx, in float32
    assert ws >= padded_x, (ws, name)
    given = _asymmetric_problem(op, batch_stride=0)
    given.algo_policy, given.algo_id = ABI.ALGO_GIVEN, algo
    assert _plan(cudnn, given)[:2] == (ws, algo)
    tight = _asymmetric_problem(op, batch_stride=0)
    tight.workspace_limit = padded_x - 1
    got = _try_plan(cudnn, tight)
    assert isinstance(got, tuple) and got[0] == "UNSUPPORTED" and "workspace" in got[1], got


def test_broadcast_bias_is_not_fused(cudnn, info):
    """A bias of stride 0 (torch's b0.expand(K)) has no cuDNN tensor (positive strides only):
    it plans unfused, and our epilogue reads its one element."""
    _gpu(info)
    x, y = _channels_last([8, 64, 28, 28], "float16"), _channels_last([8, 64, 28, 28], "float16")
    w = _channels_last([64, 64, 3, 3], "float16")
    args = conv_args(x, w, y, padding=1, bias=tensor([64], F.DTYPES["float16"], strides=[0]))
    args.activation = ABI.ACTIVATION_RELU
    _, algo, name = _plan(cudnn, args)
    assert not (algo >> 40) & 1 and "fused" not in name, name

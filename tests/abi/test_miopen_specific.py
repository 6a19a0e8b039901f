"""What only the MIOpen shim does, through its C table with ctypes (below the core), on the
MIOpen test double (tests/doubles/miopen) unless FLUX_DNN_MIOPEN_REAL=1.

What every shim owes the header is in test_abi.py; the numbers it computes are the
conformance suite's. Here: its names and versions, its words for a missing MIOpen and for a
machine without an AMD GPU (fresh processes: this one has the double loaded), float64 and
int32 limits refused before any vendor call, and the algorithm policies over immediate mode's
solutions. On the double, the solutions are its two (id 2 "GEMM" with workspace, first in
MIOpen's order; id 1 "Direct" without); the tests that rely on them say so."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from doubles import miopen as miopen_double

from . import fdnn_ctypes as F
from . import problems as P
from .fdnn_ctypes import ABI, DeviceDescribeArgs, Shim, conv_args, new, tensor
from .shims import SOURCES, open_shim

ROCM = (ABI.DEVICE_ROCM, 0)
OPS = (ABI.CONV_FORWARD, ABI.CONV_BACKWARD_DATA, ABI.CONV_BACKWARD_WEIGHT)
ON_DOUBLE = miopen_double.wanted()


@pytest.fixture(scope="module")
def miopen(tmp_path_factory) -> Shim:
    shim = open_shim("miopen", tmp_path_factory)
    if shim.reason() is not None:
        pytest.skip(f"the MIOpen shim cannot run here: {shim.reason()}")
    return shim


def _problem(op=ABI.CONV_FORWARD, dtype="float32", lo=1, hi=1, **fields):
    t = F.DTYPES[dtype]
    x, w = tensor([2, 4, 8, 8], t, ROCM), tensor([6, 4, 3, 3], t, ROCM)
    out = 8 + lo + hi - 2
    y = tensor([2, 6, out, out], t, ROCM)
    args = conv_args(x, w, y, op=op, padding=lo)
    for i in range(2):
        args.padding_hi[i] = hi
    for k, v in fields.items():
        setattr(args, k, v)
    return args


def _plan(shim, args):
    error = shim.call("Conv_Plan_Create", args)
    assert error is None, error
    result = (args.workspace_size, args.chosen_algo_id, args.algo_name.decode())
    shim.destroy(args.plan)
    return result


def _fresh_info(shim_path: str, env: dict) -> str:
    """Shim_Info's (num_devices, unavailable_reason, runtime version) in a new process."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); from abi.fdnn_ctypes import Shim; "
        "i = Shim(sys.argv[1]).info(); print(i.num_devices); "
        "print((i.unavailable_reason or b'').decode().replace(chr(10), ' ')); print(i.vendor_version_runtime.decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, shim_path, tests], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


def test_info_names_miopen(miopen):
    info = miopen.info()
    assert (info.shim_name, info.vendor_name) == (b"miopen", b"MIOpen")
    assert info.device_type == ABI.DEVICE_ROCM and info.priority == ABI.PRIORITY_VENDOR
    assert re.fullmatch(rb"\d+\.\d+\.\d+", info.vendor_version_runtime)
    assert not miopen.api.Conv_Plan_Pack_Weights  # MIOpen reads w as it is


def test_device_name_names_miopen(miopen):
    args = new(DeviceDescribeArgs, device_id=0)
    assert miopen.call("Device_Describe", args) is None
    assert b"(MIOpen " in args.name and args.default_flags == 0


def test_info_says_miopen_is_missing(tmp_path):
    """No MIOpen anywhere the shim looks: it loads, and says so in words."""
    source = SOURCES.get("miopen")
    if source is None or source.missing:
        pytest.skip("no MIOpen shim library here")
    env = {**os.environ, "FLUX_DNN_MIOPEN_LIBRARY": str(tmp_path / "none" / "libMIOpen.so.1")}
    env["ROCM_PATH"] = str(tmp_path / "no-rocm")
    if os.path.exists("/opt/rocm/lib/libMIOpen.so.1"):
        pytest.skip("a MIOpen is installed in /opt/rocm")
    devices, reason, version = _fresh_info(source.library, env).splitlines()
    assert devices == "0" and version == ""
    assert reason.startswith("MIOpen not found (libMIOpen.so.1"), reason


@pytest.mark.skipif(not ON_DOUBLE, reason="FLUX_DNN_MIOPEN_REAL=1: the no-GPU case needs the double")
def test_info_says_there_is_no_amd_gpu(miopen, tmp_path):
    """The HIP runtime reports no device (hipErrorNoDevice): the shim says so, with the
    MIOpen version it found."""
    env = {**os.environ, "FLUX_DNN_HIP_DOUBLE_DEVICES": "0"}
    devices, reason, version = _fresh_info(miopen.path, env).splitlines()
    assert devices == "0" and version
    assert reason == f"no AMD GPU found (the HIP runtime reports no device; MIOpen {version} is installed)"


def test_float64_is_refused_with_the_reason(miopen):
    caps = miopen.capabilities(ABI.CONV_FORWARD, F.DTYPES["float64"])
    assert caps.support == ABI.SUPPORT_NONE and caps.detail == b"MIOpen has no float64 convolution"
    code, message = miopen.call("Conv_Plan_Create", _problem(dtype="float64"))
    assert code == "UNSUPPORTED" and "float64" in message


def test_sizes_beyond_int32_are_refused_before_any_vendor_call(miopen):
    x, w = tensor([1, 1, 65536, 65536], device=ROCM), tensor([1, 1, 1, 1], device=ROCM)
    y = tensor([1, 1, 65536, 65536], device=ROCM)
    code, message = miopen.call("Conv_Plan_Create", conv_args(x, w, y))
    assert code == "UNSUPPORTED" and "int32" in message, message


@pytest.mark.parametrize("op", OPS)
def test_given_id_reproduces_the_choice(miopen, op):
    for policy in (ABI.ALGO_HEURISTIC, ABI.ALGO_BENCHMARK):
        ws, algo, name = _plan(miopen, _problem(op, algo_policy=policy))
        assert name.startswith(f"miopen solution {algo} (")
        assert _plan(miopen, _problem(op, algo_policy=ABI.ALGO_GIVEN, algo_id=algo)) == (ws, algo, name)


def test_an_unknown_solution_id_is_refused(miopen):
    code, message = miopen.call("Conv_Plan_Create", _problem(algo_policy=ABI.ALGO_GIVEN, algo_id=987654))
    assert code == "INVALID_ARGUMENT" and "987654" in message


@pytest.mark.skipif(not ON_DOUBLE, reason="relies on the double's two solutions")
def test_solutions_follow_the_workspace_limit_and_determinism(miopen):
    ws, algo, name = _plan(miopen, _problem())
    assert (algo, name) == (2, "miopen solution 2 (GEMM)") and ws > 0  # MIOpen's first
    assert _plan(miopen, _problem(workspace_limit=0))[:2] == (0, 1)  # the one needing none
    assert _plan(miopen, _problem(flags=ABI.CONV_DETERMINISTIC))[1] == 1


@pytest.mark.skipif(not ON_DOUBLE, reason="relies on the double's solution 1 (no workspace)")
def test_asymmetric_padding_takes_a_padded_copy_in_the_workspace(miopen):
    """MIOpen pads symmetrically: x (2, 4, 8, 8) padded (1, 2) goes to an (11, 11) copy."""
    direct = dict(algo_policy=ABI.ALGO_GIVEN, algo_id=1)
    symmetric = _plan(miopen, _problem(**direct))[0]
    asymmetric = _plan(miopen, _problem(lo=1, hi=2, **direct))[0]
    assert symmetric == 0 and asymmetric >= 2 * 4 * 11 * 11 * 4
    code, message = miopen.call("Conv_Plan_Create", _problem(lo=1, hi=2, workspace_limit=100))
    assert code == "UNSUPPORTED" and "workspace" in message


_CONV_ON_ROCM = """
import numpy as np, flux_dnn
from conformance import rocm_host
rocm_host.register_adapter()
x, w = (rocm_host.RocmHostArray(np.ones(s, np.float32)) for s in ((1, 2, 5, 5), (2, 2, 3, 3)))
try:
    flux_dnn.conv2d(x, w)
except flux_dnn.DeviceUnavailableError as e:
    print(e)
"""


def _require_installed():
    from conformance.rocm_host import miopen_shim_installed

    if not miopen_shim_installed():
        pytest.skip("flux-dnn-rocm is not installed (the error comes through its entry point)")


def _conv_error(env: dict) -> str:
    """What flux_dnn.conv2d says for ROCm arrays in a new process with `env`."""
    _require_installed()
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _CONV_ON_ROCM], capture_output=True, text=True, env=env, cwd=tests)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_convolution_says_miopen_is_missing(tmp_path):
    if os.path.exists("/opt/rocm/lib/libMIOpen.so.1"):
        pytest.skip("a MIOpen is installed in /opt/rocm")
    env = {**os.environ, "FLUX_DNN_MIOPEN_LIBRARY": str(tmp_path / "libMIOpen.so.1"), "ROCM_PATH": str(tmp_path)}
    message = _conv_error(env)
    assert "no usable flux_dnn shim for ROCm arrays" in message and "MIOpen not found" in message, message
    assert "pip install flux-dnn-rocm" in message


@pytest.mark.skipif(not ON_DOUBLE, reason="FLUX_DNN_MIOPEN_REAL=1: the no-GPU case needs the double")
def test_a_convolution_says_there_is_no_amd_gpu(tmp_path):
    _require_installed()
    library = miopen_double.build_or_skip(tmp_path / "double")
    env = {**os.environ, "FLUX_DNN_MIOPEN_LIBRARY": str(library), "FLUX_DNN_HIP_DOUBLE_DEVICES": "0"}
    message = _conv_error(env)
    assert "shim 'miopen': no AMD GPU found (the HIP runtime reports no device" in message, message


def test_miopen_databases_are_left_where_miopen_puts_them(miopen, tmp_path):
    """The shim sets no MIOPEN_* variable (review D13): in a PyTorch process MIOpen's databases
    and kernel cache are PyTorch's too, and setenv races with other threads' getenv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIOPEN_")}
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[2]); from abi.fdnn_ctypes import Shim; Shim(sys.argv[1]).info(); "
        "print(sorted(k for k in os.environ if k.startswith('MIOPEN_')))"
    )
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", code, miopen.path, tests], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not ON_DOUBLE, reason="executes on host memory: the double's")
@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_grouped_dilated_asymmetric_with_epilogue(miopen, rng, op, rank):
    """Groups with dilation (one MIOpen call: review D9), asymmetric padding (a padded copy),
    alpha and beta (tensor ops), a bias or its gradient, 1-D as 2-D; against the float64
    reference."""
    problem = P.Problem(
        miopen,
        op=op,
        rank=rank,
        groups=2,
        dilation=2,
        lo=2,
        hi=1,
        alpha=0.5,
        beta=0.25,
        bias=op != "backward_data",
        seed=int(rng.integers(2**31)),
    )
    handle, size = P.plan(miopen, problem)
    try:
        assert "per group" not in problem.args.algo_name.decode()  # owned by the plan
        assert miopen.call("Conv_Plan_Execute", problem.execute_args(handle, size)) is None
    finally:
        miopen.destroy(handle)
    P.check_result(problem)


@pytest.mark.skipif(not ON_DOUBLE, reason="makes the double's find-db record appear")
@pytest.mark.parametrize("op", OPS)
def test_a_given_id_is_served_after_a_find_db_record_appears(miopen, op):
    """GetSolution lists a find-db record's solutions once one exists, else the fallback's
    (MIOpen's convolutionocl.cpp GetSolutions), so an id kept from an earlier plan may no
    longer be listed; MIOpen still runs any applicable id (review D8)."""
    import ctypes

    record = ctypes.CDLL(os.environ["FLUX_DNN_MIOPEN_LIBRARY"]).fdnn_double_set_find_record
    ws, algo, _ = _plan(miopen, _problem(op))
    record(1)
    try:
        listed = _plan(miopen, _problem(op))[1]
        assert listed != algo  # the list changed
        assert _plan(miopen, _problem(op, algo_policy=ABI.ALGO_GIVEN, algo_id=algo))[:2] == (ws, algo)
    finally:
        record(0)


@pytest.mark.skipif(not ON_DOUBLE, reason="relies on the double's solution 2 (workspace) and 1 (none)")
def test_the_workspace_stays_within_the_limit_with_the_shims_part(miopen):
    """MIOpen's part is 256-byte aligned before the shim's copies: a solution fits when the
    rounded total does (review D14)."""
    cursor = _plan(miopen, _problem(lo=1, hi=2, algo_policy=ABI.ALGO_GIVEN, algo_id=1))[0]
    gemm = 2 * 6 * 9 * 9 * 4 + 64  # the double's GEMM workspace for y (2, 6, 9, 9)
    assert gemm % 256 != 0
    limit = gemm + cursor
    ws, algo, _ = _plan(miopen, _problem(lo=1, hi=2, workspace_limit=limit))
    assert ws <= limit and algo == 1


@pytest.mark.skipif(not ON_DOUBLE, reason="FLUX_DNN_MIOPEN_DOUBLE_VERSION sets the double's version")
@pytest.mark.parametrize(("version", "claimed"), [("2.17.0", False), ("2.18.0", True)])
def test_deterministic_is_claimed_from_miopen_2_18(miopen, version, claimed):
    """MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC came in MIOpen 2.18 (commit 95716c2ed); on 2.16
    and 2.17 miopenSetConvolutionAttribute exists but refuses it (review D7)."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); from abi.fdnn_ctypes import Shim, ABI, DTYPES; "
        "print(Shim(sys.argv[1]).capabilities(ABI.CONV_FORWARD, DTYPES['float32']).features)"
    )
    env = {**os.environ, "FLUX_DNN_MIOPEN_DOUBLE_VERSION": version}
    done = subprocess.run([sys.executable, "-c", code, miopen.path, tests], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert bool(int(done.stdout) & ABI.FEATURE_DETERMINISTIC) == claimed


def test_bfloat16_is_refused_with_the_reason(miopen):
    """MIOpen has no bfloat16 tensor ops for what surrounds a convolution (review D4): refused
    at plan time, from the capabilities, never at execute."""
    caps = miopen.capabilities(ABI.CONV_FORWARD, F.DTYPES["bfloat16"])
    assert caps.support == ABI.SUPPORT_NONE and b"bfloat16" in caps.detail
    code, message = miopen.call("Conv_Plan_Create", _problem(dtype="bfloat16"))
    assert code == "UNSUPPORTED" and "bfloat16" in message


@pytest.mark.skipif(not ON_DOUBLE, reason="loads a second copy of the double's HIP runtime")
def test_two_hip_runtimes_make_the_shim_unavailable(miopen, tmp_path):
    """Arrays of one HIP runtime must not reach MIOpen on another (review D10): with two
    libamdhip64 mapped the shim says so instead of running."""
    # another soname: the loader reuses a loaded object whose soname matches a DT_NEEDED entry
    other = tmp_path / "libamdhip64.so.7"
    cxx = os.environ.get("CXX") or shutil.which("c++") or pytest.skip("no C++ compiler")
    source = pathlib.Path(miopen_double.HERE, "hip_double.cpp")
    includes = [f"-I{d}" for d in miopen_double.INCLUDES]
    soname = "-Wl,-soname,libamdhip64.so.7"
    command = [cxx, "-std=c++17", "-shared", "-fPIC", *includes, str(source), soname, "-o", str(other)]
    subprocess.run(command, check=True)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[3], mode=ctypes.RTLD_GLOBAL); sys.path.insert(0, sys.argv[2]); "
        "from abi.fdnn_ctypes import Shim; print((Shim(sys.argv[1]).info().unavailable_reason or b'').decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, miopen.path, tests, str(other)], capture_output=True, text=True, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("more than one HIP runtime is loaded"), done.stdout

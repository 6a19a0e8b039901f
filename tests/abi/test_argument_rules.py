"""The header's argument rules at the ends of their ranges (issue 16): each finding of the ABI
fuzzer (tests/abi_fuzz/fuzz.py) as a named regression test, run against every shim library
the build has. A shim answers anything outside the rules with INVALID_ARGUMENT, a valid
problem beyond its vendor's range with UNSUPPORTED, never with a crash, a hang or a success.

The fake shims (tests/fake_shim.c) stand for the suite itself, not for the shared argument
check of csrc/shims/common that every real shim runs: they skip here."""

from __future__ import annotations

import ctypes as C
import time

import numpy as np
import pytest

from . import fdnn_ctypes as F
from .fdnn_ctypes import ABI
from .problems import Problem, check_result, plan
from .test_abi import assert_refused, on_cpu, usable

INT64_MAX = 2**63 - 1
REFUSALS = ("INVALID_ARGUMENT", "UNSUPPORTED")


@pytest.fixture
def real(shim):
    """A shim built on the shared argument check: not a fake; skips when it cannot plan."""
    if shim.source.name.startswith("fake"):
        pytest.skip("the fake shim has no vendor and not the shared argument check of csrc/shims/common")
    usable(shim)
    return shim


def descriptors_only(shim, x, w, y, *, op=0, bias=None, **geometry):
    """Args of a problem described without data (as a caller may at plan time), on device 0."""
    device = (shim.info().device_type, 0)
    t = [F.tensor(s, device=device) for s in (x, w, y)]
    b = F.tensor(bias, device=device) if bias else None
    return F.conv_args(*t, op=op, rank=len(x) - 2, bias=b, **geometry)


def create(shim, args):
    """Conv_Plan_Create with out fields preset; asserts that an error wrote none of them and
    destroys a plan it made. Returns the error, or None."""
    args.plan, args.workspace_size, args.chosen_algo_id = 12345, 777, -5
    error = shim.call("Conv_Plan_Create", args)
    if error is None:
        shim.destroy(args.plan)
    else:
        assert (args.plan, args.workspace_size, args.chosen_algo_id) == (12345, 777, -5), error
    return error


# ---------------------------------------------------------------------------------------------
# Sizes: int64 is the header's end, the vendor's integer range the shim's


@pytest.mark.parametrize(
    "case",
    [
        "C=2^32",  # valid by the header: the vendor's range decides
        "N=2^31,bwd_weight",  # oneDNN hung in its code generator
        "K=2^31",
        "kernel=2^31",
    ],
)
def test_dims_from_2_31_are_served_or_unsupported_never_a_crash_or_hang(real, case):
    shapes = {
        "C=2^32": ([1, 2**32, 1, 1], [1, 2**32, 1, 1], [1, 1, 1, 1], 0),
        "N=2^31,bwd_weight": ([2**31, 1, 2, 2], [1, 1, 1, 1], [2**31, 1, 2, 2], 2),
        "K=2^31": ([1, 1, 2, 2], [2**31, 1, 1, 1], [1, 2**31, 2, 2], 0),
        "kernel=2^31": ([1, 1, 1, 2**31], [1, 1, 1, 2**31], [1, 1, 1, 1], 1),
    }
    x, w, y, op = shapes[case]
    start = time.monotonic()
    error = create(real, descriptors_only(real, x, w, y, op=op))
    assert error is None or error[0] == "UNSUPPORTED", error
    assert time.monotonic() - start < 30, "a refusal of a size must not take the vendor's time"


@pytest.mark.parametrize(
    "case",
    [
        "N=2^62",  # 2^62 images of 2x2 floats: more bytes than int64 counts
        "C=2^62",
        "stride=2^62",  # a span beyond int64 from a stride alone
    ],
)
@pytest.mark.parametrize("policy", ["heuristic", "benchmark"])
def test_extents_beyond_int64_are_invalid(real, case, policy):
    """Also under the benchmark policy, whose timing buffers were sized with wrapping
    arithmetic (free(): invalid pointer)."""
    if case == "stride=2^62":
        args = descriptors_only(real, [2, 1, 2, 2], [1, 1, 1, 1], [2, 1, 2, 2])
        args.x.contents.strides[0] = 2**62
        words = ("x", "INT64_MAX")
    elif case == "N=2^62":
        args = descriptors_only(real, [2**62, 1, 2, 2], [1, 1, 1, 1], [2**62, 1, 2, 2])
        words = ("INT64_MAX",)
    else:
        args = descriptors_only(real, [1, 2**62, 2, 2], [1, 2**62, 1, 1], [1, 1, 2, 2])
        words = ("INT64_MAX",)
    args.algo_policy = ABI.ALGO_BENCHMARK if policy == "benchmark" else ABI.ALGO_HEURISTIC
    assert_refused(real, create(real, args), "INVALID_ARGUMENT", *words)


def test_padding_int64_max_on_both_sides_is_invalid(real):
    """x + padding_lo + padding_hi wrapped around and passed the shape check."""
    args = descriptors_only(real, [1, 1, 4, 4], [1, 1, 3, 3], [1, 1, 2, 2])
    args.padding_lo[0] = args.padding_hi[0] = INT64_MAX
    assert_refused(real, create(real, args), "INVALID_ARGUMENT", "padding", "INT64_MAX")


def test_dilation_whose_kernel_extent_overflows_is_invalid(real):
    args = descriptors_only(real, [1, 1, 4, 4], [1, 1, 3, 3], [1, 1, 2, 2])
    args.dilation[1] = 2**62
    assert_refused(real, create(real, args), "INVALID_ARGUMENT", "dilation", "INT64_MAX")


def test_a_huge_valid_stride_is_served_or_unsupported(real):
    """stride 2^62 over a small input: the output is 1 wide; valid by the header."""
    args = descriptors_only(real, [1, 1, 4, 4], [1, 1, 3, 3], [1, 1, 1, 2])
    args.stride[0] = 2**62
    error = create(real, args)
    assert error is None or error[0] == "UNSUPPORTED", error


def test_benchmark_of_a_huge_valid_problem_does_not_time_it_on_gigabytes(real):
    """The benchmark policy sized its timing buffers with wrapping arithmetic (heap corruption)
    and would allocate and touch each tensor's whole span: a span of 2^30 floats must not cost
    4 GiB of memory and its time."""
    args = descriptors_only(real, [2, 1, 4, 4], [1, 1, 3, 3], [2, 1, 2, 2])
    args.x.contents.strides[0] = 2**30 - 16
    args.algo_policy = ABI.ALGO_BENCHMARK
    start = time.monotonic()
    error = create(real, args)
    assert error is None or error[0] == "UNSUPPORTED", error
    assert time.monotonic() - start < 30


# ---------------------------------------------------------------------------------------------
# Strides: negative never, zero only where the op reads


@pytest.mark.parametrize("tensor", ["x", "w", "y", "bias"])
def test_negative_strides_are_invalid(real, tensor):
    p = Problem(real, bias=True)
    p.descriptors[tensor].strides[0] = -p.descriptors[tensor].strides[0]
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", tensor, "strides[0]", ">= 0")


@pytest.mark.parametrize(
    "op, tensor",
    [("forward", "y"), ("backward_data", "x"), ("backward_weight", "w"), ("backward_weight", "bias")],
)
def test_a_zero_stride_on_a_written_tensor_is_invalid(real, op, tensor):
    """oneDNN wrote 8-12 bytes past a zero-stride bias gradient; a written tensor whose
    elements overlap has no defined result, so the header forbids it."""
    p = Problem(real, op=op, bias=op != "backward_data")
    p.descriptors[tensor].strides[1 if tensor != "bias" else 0] = 0
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", tensor, "overlap")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("tensor", ["x", "w", "bias"])
def test_a_zero_stride_on_a_read_tensor_broadcasts(real, tensor, dtype):
    """A read tensor with stride 0 on its first dim: every slice is the first one (a
    broadcast), served as such (compared with the float64 reference) or refused as
    UNSUPPORTED. oneDNN read a broadcast bias of a converted 16-bit plan past the staging
    buffer it had reserved (the fuzzer's guard bytes)."""
    on_cpu(real)
    if real.capabilities(ABI.CONV_FORWARD, F.DTYPES[dtype]).support == ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} is not computed here")
    p = Problem(real, dtype=dtype, bias=True, seed=16)
    p.values[tensor][1:] = p.values[tensor][:1]
    p.arrays[tensor][1:] = p.arrays[tensor][:1]
    p.descriptors[tensor].strides[0] = 0
    error = real.call("Conv_Plan_Create", p.args)
    if error is not None:
        assert error[0] == "UNSUPPORTED", error
        return
    handle, size = p.args.plan, p.args.workspace_size
    try:
        assert real.call("Conv_Plan_Execute", p.execute_args(handle, size)) is None
    finally:
        real.destroy(handle)
    check_result(p)


# ---------------------------------------------------------------------------------------------
# Devices, dtypes, ranks of every descriptor (the bias included)


@pytest.mark.parametrize("tensor", ["x", "w", "y", "bias"])
@pytest.mark.parametrize("device_id", [1, -1])
def test_a_device_id_out_of_range_is_invalid_on_every_tensor(real, tensor, device_id):
    p = Problem(real, bias=True)
    for name in ("x", "w", "y", "bias") if tensor == "x" else (tensor,):
        p.descriptors[name].device.device_id = device_id
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "device")


def test_the_bias_device_type_is_checked(real):
    p = Problem(real, bias=True)
    other = ABI.DEVICE_CUDA if p.device[0] != ABI.DEVICE_CUDA else ABI.DEVICE_CPU
    p.descriptors["bias"].device.device_type = other
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "bias", "device type")


@pytest.mark.parametrize("lanes", [0, 2, 4])
def test_dtype_lanes_other_than_1_are_invalid(real, lanes):
    p = Problem(real, bias=True)
    for d in p.descriptors.values():
        d.dtype.lanes = lanes
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "lanes")


@pytest.mark.parametrize("lanes", [0, 2, 16])
def test_compute_type_lanes_other_than_1_are_invalid(real, lanes):
    p = Problem(real)
    p.args.compute_type = F.DLDataType(ABI.DTYPE_FLOAT, 32, lanes)
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "compute_type", "lanes")


@pytest.mark.parametrize("bits", [0, 12])
def test_dtype_bits_that_are_not_whole_bytes_are_invalid(real, bits):
    p = Problem(real)
    for name in ("x", "w", "y"):
        p.descriptors[name].dtype.bits = bits
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "bits")


@pytest.mark.parametrize("ndim", [-1, -(2**31), 2])
def test_a_bias_ndim_other_than_0_or_1_is_invalid(real, ndim):
    p = Problem(real, bias=True)
    p.descriptors["bias"].ndim = ndim
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "bias", "ndim")


@pytest.mark.parametrize("groups", [2**62, INT64_MAX])
def test_huge_groups_are_invalid_without_wrapping(real, groups):
    """w's C/groups times groups is never formed: it could wrap around int64."""
    args = descriptors_only(real, [1, 2**60, 1, 1], [4, 4, 1, 1], [1, 4, 1, 1])
    args.groups = groups
    assert_refused(real, create(real, args), "INVALID_ARGUMENT", "groups")


# ---------------------------------------------------------------------------------------------
# workspace_limit, whichever plan the shim falls back to


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("limit", [0, 1, 64, 256])
def test_every_plan_keeps_workspace_limit(real, op, dtype, limit):
    """Limit 0 gave a 256-byte fallback plan: a plan is within the limit or refused."""
    p = Problem(real, op=op, dtype=dtype, bias=op != "backward_data", groups=2)
    p.args.workspace_limit = limit
    error = real.call("Conv_Plan_Create", p.args)
    if error is not None:
        assert error[0] == "UNSUPPORTED", error
        return
    try:
        assert p.args.workspace_size <= limit
    finally:
        real.destroy(p.args.plan)


# ---------------------------------------------------------------------------------------------
# Execute checks its own arguments


@pytest.mark.parametrize("short", ["one_byte", "null"])
def test_execute_refuses_a_short_or_null_workspace(real, short):
    on_cpu(real)
    p = Problem(real, bias=True, dtype="float16")  # staged 16-bit operands need a workspace
    p.args.workspace_limit = C.c_size_t(-1).value
    handle, size = plan(real, p)
    try:
        if size == 0:
            pytest.skip("this plan needs no workspace")
        args = p.execute_args(handle, size)
        if short == "null":
            args.workspace = None
        else:
            args.workspace_size = size - 1
        error = real.call("Conv_Plan_Execute", args)
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "workspace" in error[1], error
        assert np.isnan(p.result()).all()  # nothing written
    finally:
        real.destroy(handle)


@pytest.mark.parametrize("pointer", ["x", "w", "y"])
def test_execute_refuses_a_null_pointer_the_op_needs(real, pointer):
    on_cpu(real)
    p = Problem(real)
    handle, size = plan(real, p)
    try:
        error = real.call("Conv_Plan_Execute", p.execute_args(handle, size, **{pointer: None}))
        assert error is not None and error[0] == "INVALID_ARGUMENT", error
    finally:
        real.destroy(handle)

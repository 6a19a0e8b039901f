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

from . import device_memory
from . import fdnn_ctypes as F
from .fdnn_ctypes import ABI
from .problems import OPS as OPS_CODES
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


# ---------------------------------------------------------------------------------------------
# What the header left open, decided (issue 23): one named test per decision, on every shim
# built on the shared argument check (csrc/shims/common). The header says each decision.


def _workspace_plan(shim):
    """A plan that needs workspace (staged 16-bit operands, or a layout to relay), or a skip."""
    for dtype in ("float16", "bfloat16", "float32"):
        if shim.capabilities(ABI.CONV_FORWARD, F.DTYPES[dtype]).support == ABI.SUPPORT_NONE:
            continue
        p = Problem(shim, dtype=dtype, bias=True, beta=0.5)
        if shim.call("Conv_Plan_Create", p.args) is not None:
            continue
        if p.args.workspace_size > 0:
            return p
        shim.destroy(p.args.plan)
    pytest.skip("no plan of this shim here needs a workspace")


def test_execute_refuses_a_workspace_not_64_byte_aligned(real):
    """Decision: the header's 64-byte workspace alignment is enforced at execute
    (INVALID_ARGUMENT, nothing written), as its other execute rules are."""
    p = _workspace_plan(real)
    try:
        args = p.execute_args(p.args.plan, p.args.workspace_size)
        args.workspace += 8  # 8-aligned, not 64: the workspace has 64 bytes to spare
        old = p.arrays[p.out].copy()
        error = real.call("Conv_Plan_Execute", args)
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "64-byte" in error[1], error
        if p.cpu:
            assert np.array_equal(p.arrays[p.out], old, equal_nan=True)  # nothing written
    finally:
        real.destroy(p.args.plan)


def test_a_plan_that_needs_no_workspace_ignores_the_workspace_pointer(real):
    """Decision: the alignment rule binds a workspace the plan uses; with workspace_size 0
    the pointer is not read, whatever it is."""
    on_cpu(real)
    p = Problem(real)
    handle, size = plan(real, p)
    try:
        if size != 0:
            pytest.skip("this plan needs a workspace")
        args = p.execute_args(handle, 0)
        args.workspace = 8  # neither NULL nor aligned nor memory
        assert real.call("Conv_Plan_Execute", args) is None
    finally:
        real.destroy(handle)
    check_result(p)


#: Read tensors of each op, and a dim whose stride is made to overlap another's.
READ_TENSORS = [("forward", "x"), ("forward", "w"), ("backward_data", "y"), ("backward_data", "w")]
READ_TENSORS += [("backward_weight", "x"), ("backward_weight", "y")]


def _overlapping_view(p, name, rng):
    """Makes p's tensor `name` a sliding window over one buffer: dim 1 with stride 1, as the
    last dim has (dim 1's neighbouring slices share all but one element)."""
    a = p.arrays[name]
    strides = [s // a.itemsize for s in a.strides]
    strides[1] = 1
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    base_values = rng.integers(-4, 5, span) / 4.0
    base = Problem._store(base_values, a.dtype.type if a.dtype != np.uint16 else np.uint16)
    if p.memory:  # a device shim reads its own memory (device_memory.py)
        base = device_memory.copy(p.memory, base)
    view = np.lib.stride_tricks.as_strided(base, a.shape, [s * a.itemsize for s in strides])
    p.values[name] = np.lib.stride_tricks.as_strided(base_values, a.shape, [s * 8 for s in strides]).copy()
    p.arrays[name] = view
    p._keep.append(base)
    d = p.descriptors[name]
    d.strides[1] = 1
    if p.cpu:
        d.data = view.ctypes.data


@pytest.mark.parametrize("op, tensor", READ_TENSORS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_read_tensors_with_overlapping_strides_are_served(real, rng, op, tensor, dtype):
    """Decision: a read tensor whose strides overlap (valid by the header) is served, by every
    shim and algorithm: the oneDNN shim, whose descriptors take no such strides (it answered
    VENDOR), gathers it into a compact copy in the workspace first. Checked against the
    float64 reference under the heuristic, the benchmark and each algorithm id 0 to 8; an id
    is refused only as it is without the overlap (an id naming no algorithm, an algorithm
    that cannot compute the problem), never VENDOR."""
    if real.capabilities(OPS_CODES[op], F.DTYPES[dtype]).support == ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} {op} is not computed here")
    ids = set()
    for policy in (ABI.ALGO_HEURISTIC, ABI.ALGO_BENCHMARK, *range(100, 109)):
        given = dict(policy=ABI.ALGO_GIVEN) if policy >= 100 else dict(policy=policy)
        p = Problem(real, op=op, dtype=dtype, seed=int(rng.integers(2**31)), **given)
        _overlapping_view(p, tensor, rng)
        p.args.algo_id = max(policy - 100, 0)
        error = real.call("Conv_Plan_Create", p.args)
        if error is not None:
            assert policy >= 100, error
            plain = Problem(real, op=op, dtype=dtype, **given)
            plain.args.algo_id = p.args.algo_id
            assert (create(real, plain.args) or ("served",))[0] == error[0], error
            continue
        ids.add(p.args.chosen_algo_id)
        try:
            if p.cpu:
                assert real.call("Conv_Plan_Execute", p.execute_args(p.args.plan, p.args.workspace_size)) is None
        finally:
            real.destroy(p.args.plan)
        if p.cpu:
            check_result(p)
    assert ids, "no policy planned the problem"


@pytest.mark.parametrize("tensor", ["w", "y", "bias"])
def test_a_dtype_other_than_xs_is_invalid_on_every_tensor(real, tensor):
    """Decision: x, w, y and bias share one dtype (the capabilities' dtype); another one on
    any of them, the bias included, is INVALID_ARGUMENT, not a conversion."""
    p = Problem(real, bias=True)
    p.descriptors[tensor].dtype.bits = 64
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", tensor, "one dtype")


@pytest.mark.parametrize("tensor", ["w", "y", "bias"])
def test_tensors_on_different_devices_are_invalid(real, tensor):
    """Decision: every tensor is on x's device (type and id); another is INVALID_ARGUMENT."""
    p = Problem(real, bias=True)
    p.descriptors[tensor].device.device_id = 1
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", tensor, "device")


@pytest.mark.parametrize("op", ["backward_data", "backward_weight"])
def test_an_activation_on_a_backward_op_is_invalid(real, op):
    """Decision: activations are FORWARD only; one on a backward op is INVALID_ARGUMENT (not
    UNSUPPORTED: no shim may fuse one there)."""
    p = Problem(real, op=op, activation="relu")
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "activation", "forward only")


def test_a_bias_on_backward_data_is_invalid(real):
    """Decision: backward_data takes no bias (ndim 0); one described is INVALID_ARGUMENT.
    (On backward_weight a bias is the bias gradient; its absence of a capability bit is
    UNSUPPORTED.)"""
    p = Problem(real, op="backward_data", bias=True)
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "bias")


@pytest.mark.parametrize("op", ["backward_data", "backward_weight"])
def test_packing_a_backward_plan_is_invalid(real, op):
    """Decision: Conv_Plan_Pack_Weights takes a FORWARD plan; a backward one is
    INVALID_ARGUMENT (shared check_pack_args), with no packed plan written."""
    if not real.api.Conv_Plan_Pack_Weights:
        pytest.skip("this shim has no Conv_Plan_Pack_Weights (NULL in its table)")
    p = Problem(real, op=op)
    handle, _ = plan(real, p)
    try:
        args = F.new(
            F.ConvPlanPackWeightsArgs, plan=handle, w=p.arrays["w"].ctypes.data, packed_plan=12345, stream=p.stream
        )
        error = real.call("Conv_Plan_Pack_Weights", args)
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "forward" in error[1], error
        assert args.packed_plan == 12345
    finally:
        real.destroy(handle)


@pytest.mark.parametrize("tensor", ["x", "w", "y", "bias"])
def test_a_null_data_with_a_misaligned_byte_offset_is_invalid(real, tensor):
    """Decision: data + byte_offset is element-aligned with data NULL too (then byte_offset
    itself): a descriptor at plan time cannot promise an alignment no call can have."""
    p = Problem(real, bias=True)
    p.descriptors[tensor].data = None
    p.descriptors[tensor].byte_offset = 2
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", tensor, "byte_offset")


@pytest.mark.parametrize("algo_id", [-1, 987654, 2**40 + 7, 2**62])
def test_an_algo_id_naming_none_of_the_shims_algorithms_is_invalid(real, algo_id):
    """Decision: FDNN_ALGO_GIVEN with an id the shim never returns (outside its ids, or, for
    a vendor's enumerated ids, naming no engine or solution offered for the problem) breaks
    the header's rule: INVALID_ARGUMENT. A client with a stale autotune entry searches again
    on any error."""
    p = Problem(real, policy=ABI.ALGO_GIVEN)
    p.args.algo_id = algo_id
    assert_refused(real, create(real, p.args), "INVALID_ARGUMENT", "algo")


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_an_algorithm_that_cannot_compute_the_problem_is_unsupported(real, op):
    """Decision, the other half: an id naming one of the shim's algorithms that cannot compute
    this problem here (the oneDNN shim's small-problem path 8 on a backward op, the BLAS
    shim's direct depthwise 4 with several input channels per group) is UNSUPPORTED, as any
    valid problem the shim cannot serve, so that a caller passes it on to another shim. Ids
    0 to 8 are each served (and report themselves), UNSUPPORTED, or, where they name no
    algorithm, INVALID_ARGUMENT; never VENDOR or INTERNAL."""
    for algo_id in range(9):
        p = Problem(real, op=op, policy=ABI.ALGO_GIVEN)
        p.args.algo_id = algo_id
        error = real.call("Conv_Plan_Create", p.args)
        if error is None:
            real.destroy(p.args.plan)
            continue
        assert error[0] in ("UNSUPPORTED", "INVALID_ARGUMENT", "UNAVAILABLE"), (algo_id, error)
        if error[0] == "INVALID_ARGUMENT":
            assert "names none" in error[1] or "not a MIOpen solution" in error[1], error


@pytest.mark.parametrize(
    "code, bits, lanes, expected",
    [
        (ABI.DTYPE_FLOAT, 12, 1, "INVALID_ARGUMENT"),  # the dtype form rules apply
        (ABI.DTYPE_FLOAT, 0, 1, "INVALID_ARGUMENT"),
        (ABI.DTYPE_FLOAT, 32, 2, "INVALID_ARGUMENT"),
        (0, 0, 3, "INVALID_ARGUMENT"),  # the default is lanes 0 or 1
        (ABI.DTYPE_INT, 32, 1, "UNSUPPORTED"),  # well formed, not an accumulation type served
        (ABI.DTYPE_FLOAT, 8, 1, "UNSUPPORTED"),
    ],
)
def test_compute_type_follows_the_dtype_rules(real, code, bits, lanes, expected):
    """Decision: the bits/lanes rules of tensor dtypes apply to compute_type (INVALID_ARGUMENT);
    a well-formed type the shim does not accumulate in is UNSUPPORTED (the MIOpen shim
    ignored it); code 0, bits 0 and lanes 0 or 1 is the vendor default."""
    p = Problem(real)
    p.args.compute_type = F.DLDataType(code, bits, lanes)
    assert_refused(real, create(real, p.args), expected, "compute_type")


@pytest.mark.parametrize("lanes", [0, 1])
def test_the_default_compute_type_is_served(real, lanes):
    p = Problem(real)
    p.args.compute_type = F.DLDataType(0, 0, lanes)
    assert create(real, p.args) is None


def test_deterministic_without_its_capability_bit_is_not_covered(real):
    """Decision: FDNN_CONV_DETERMINISTIC asks for something a shim without
    FEATURE_DETERMINISTIC cannot promise: not covered, UNSUPPORTED before any vendor call."""
    caps = real.capabilities(ABI.CONV_FORWARD, F.DTYPES["float32"])
    p = Problem(real, flags=ABI.CONV_DETERMINISTIC)
    error = create(real, p.args)
    if caps.support != ABI.SUPPORT_NONE and caps.features & ABI.FEATURE_DETERMINISTIC:
        assert error is None, error
    else:
        assert_refused(real, error, "UNSUPPORTED")


def test_benchmark_without_its_capability_bit_is_covered(real):
    """Decision: FDNN_ALGO_BENCHMARK is a policy, not a feature: a shim without
    FEATURE_BENCHMARK (one algorithm) serves it with its heuristic's choice."""
    caps = real.capabilities(ABI.CONV_FORWARD, F.DTYPES["float32"])
    if caps.support == ABI.SUPPORT_NONE:
        pytest.skip("float32 is not computed here")
    p = Problem(real, policy=ABI.ALGO_BENCHMARK)
    assert create(real, p.args) is None


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weight"])
def test_beta_negative_zero_does_not_read_the_output(real, op):
    """Decision: beta is compared as a number, so -0.0 is 0: the output is not read (its NaN
    does not leak into the result) and no shim stages or accumulates for it."""
    on_cpu(real)
    p = Problem(real, op=op, alpha=0.5, bias=op == "backward_weight", beta=-0.0)
    for name in (p.out, "bias") if p.writes_bias else (p.out,):
        p.arrays[name][...] = Problem._store(np.full(p.arrays[name].shape, np.nan), p.arrays[name].dtype.type)
    handle, size = plan(real, p)
    try:
        assert real.call("Conv_Plan_Execute", p.execute_args(handle, size)) is None
    finally:
        real.destroy(handle)
    check_result(p)


def test_alpha_and_beta_apply_to_the_bias_gradient(real):
    """Decision: the bias gradient is a written tensor like dw: db = alpha * sum(dy) + beta *
    db, with the same alpha and beta."""
    on_cpu(real)
    caps = real.capabilities(ABI.CONV_BACKWARD_WEIGHT, F.DTYPES["float32"])
    if not caps.features & ABI.FEATURE_BIAS_GRADIENT or not caps.features & ABI.FEATURE_ALPHA_BETA:
        pytest.skip("no bias gradient with alpha/beta here")
    p = Problem(real, op="backward_weight", bias=True, alpha=-1.5, beta=0.5)
    handle, size = plan(real, p)
    try:
        assert real.call("Conv_Plan_Execute", p.execute_args(handle, size)) is None
    finally:
        real.destroy(handle)
    check_result(p)  # dw and db against alpha * reference + beta * old


@pytest.mark.parametrize("what", ["stride", "padding", "dilation"])
def test_a_conv_parameter_beyond_int32_is_a_size_unsupported_may_refuse(real, what):
    """Decision: stride, padding and dilation are sizes in the header's sense: a valid value
    beyond the vendor's integer range may be UNSUPPORTED (a caller passes it on), never
    INVALID_ARGUMENT, a crash or a wrong plan. Each problem here is valid: output 1 wide."""
    big = 2**31 + 1
    if what == "stride":
        args = descriptors_only(real, [1, 1, 4, 4], [1, 1, 3, 3], [1, 1, 1, 2])
        args.stride[0] = big
    elif what == "padding":  # x 4 + padding 2^31 + 1 under a kernel dilated as far
        args = descriptors_only(real, [1, 1, 4, 4], [1, 1, 2, 3], [1, 1, 1, 2])
        args.padding_lo[0], args.dilation[0] = big, big + 3
    else:
        args = descriptors_only(real, [1, 1, big + 1, 4], [1, 1, 2, 3], [1, 1, 1, 2])
        args.dilation[0] = big
    error = create(real, args)
    assert error is None or error[0] == "UNSUPPORTED", error

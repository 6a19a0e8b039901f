"""The ABI 2.0 contract, checked on every shim library through ctypes (below the core).

Generic over the shim: each test with a `shim` argument runs on every library conftest.py
finds (the installed shims, FLUX_DNN_<NAME>_SHIM, the fake shim built from tests/fake_shim.c)
and asserts only what csrc/include/flux_dnn/flux_dnn.h says, driven by what the shim reports
(Shim_Info, Conv_Capabilities): a new shim is checked without editing this file. A shim that
cannot run here (no driver, no device) is still loaded and must say why; the tests that need
it to plan skip with that reason. Execution runs on CPU shims (device memory needs an array
library; the conformance suite covers those). Every error any call returns is checked as an
error object (fdnn_ctypes.error_problems) before it is destroyed."""

from __future__ import annotations

import ctypes as C
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _core

from . import device_memory
from . import fdnn_ctypes as F
from .fdnn_ctypes import ABI
from .problems import ACTIVATIONS, OPS, Problem, check_result, plan, run_and_check
from .shims import INCLUDE_DIR, SOURCES, compile_fake

FEATURES = ABI.group("FEATURE_")
# The ABI's four dtypes, and two DLPack dtypes a shim may or may not compute.
ALL_DTYPES = dict(F.DTYPES, int32=(ABI.DTYPE_INT, 32), float8=(ABI.DTYPE_FLOAT, 8))


def usable(shim) -> F.ShimInfoArgs:
    """Shim_Info of a shim that can plan here; skips with its own reason otherwise."""
    info = shim.info()
    if info.unavailable_reason is not None:
        pytest.skip(f"{info.shim_name.decode()} cannot run here: {info.unavailable_reason.decode()}")
    return info


def on_cpu(shim) -> None:
    info = usable(shim)
    if device_memory.for_device(info.device_type) is not None:
        return  # a device shim executes on memory the host reaches (device_memory.py)
    if info.device_type != ABI.DEVICE_CPU:
        pytest.skip("executes on CPU shims only: device memory needs an array library (conformance suite)")


def served(shim, op, dtype):
    """The capabilities of (op, dtype) on device 0; skips when the shim cannot run here or
    does not compute it."""
    usable(shim)
    caps = shim.capabilities(op, F.DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    if caps.support == ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} is not computed: {caps.detail.decode()}")
    return caps


def assert_refused(shim, error, code, *words):
    """error is `code` with each of `words` in its message; or, from a shim that cannot run
    here, UNAVAILABLE with its reason (a caller cannot rely on which check comes first)."""
    assert error is not None, f"accepted; expected {code}"
    reason = shim.reason()
    if reason is not None and error[0] == "UNAVAILABLE":
        assert reason in error[1], error
        return
    assert error[0] == code, error
    for word in words:
        assert word in error[1], error


def raw_error(shim, function, args) -> int:
    """The FDNN_Error* that `function` returns for args (asserted not NULL), not yet described
    or destroyed: the caller owns it."""
    error = shim.function(function)(C.addressof(args))
    assert error, f"{function} accepted {args}"
    return error


# ---------------------------------------------------------------------------------------------
# The header and the mirrors (no shim)


@pytest.mark.parametrize("typedef", sorted(set(F.LAYOUT) | set(F.MIRRORS)))
def test_mirror_is_the_headers_layout(typedef):
    assert F.mirror_mismatches(typedef) == []


def test_every_function_of_the_table_has_its_args_mirrored():
    """A function appended to the header's table (read from the layout) needs its args struct
    here, and whether it returns an error."""
    assert set(F.ARGS_OF) | set(F.VOID_ARGS_OF) == set(F.FUNCTIONS)
    assert not set(F.ARGS_OF) & set(F.VOID_ARGS_OF)


@pytest.mark.parametrize("std", ["c99", "c11", "c++17"])
def test_header_compiles_with_the_layout_core_has(tmp_path, std):
    """The header builds as C99, C11 and C++ with every warning an error (its compile-time
    checks included), and gives each struct the sizeof and _STRUCT_SIZE that _core (C++) has."""
    compiler = ["c++", "-x", "c++"] if std.startswith("c++") else ["cc"]
    if shutil.which(compiler[0]) is None:
        pytest.skip(f"no {compiler[0]} compiler here")
    lines = []
    for name, layout in F.LAYOUT.items():
        lines.append(f'  printf("{name} sizeof %zu\\n", sizeof({name}));\n')
        if layout["struct_size"] is not None:
            lines.append(f'  printf("{name} struct_size %zu\\n", (size_t){name}_STRUCT_SIZE);\n')
    source = tmp_path / "sizes.c"
    source.write_text(
        '#include <stdio.h>\n#include "flux_dnn/flux_dnn.h"\nint main(void) {\n' + "".join(lines) + "  return 0;\n}\n"
    )
    exe = tmp_path / "sizes"
    subprocess.run(
        compiler
        + [f"-std={std}", "-Wall", "-Wextra", "-pedantic", "-Werror", f"-I{INCLUDE_DIR}", str(source), "-o", str(exe)],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    compiled = {(name, what): int(value) for name, what, value in (line.split() for line in out)}
    expected = {
        (name, what): layout[what]
        for name, layout in F.LAYOUT.items()
        for what in ("sizeof", "struct_size")
        if layout[what] is not None
    }
    assert compiled == expected


@pytest.mark.parametrize("major", [ABI.ABI_MAJOR - 1, ABI.ABI_MAJOR + 1])
def test_a_table_of_another_major_is_refused(tmp_path, major):
    """The fake shim built with another abi_major: the core refuses it with an error naming
    both versions, and so does this suite's own loader (a caller reads the version first)."""
    library = compile_fake(
        tmp_path, f"major{major}", "FAKE_COMPLETE", f"FAKE_ABI_MAJOR={major}", f'FAKE_NAME="major{major}"'
    )
    with pytest.raises(
        flux_dnn.ShimLoadError,
        match=rf"built for flux_dnn ABI {major}\.{ABI.ABI_MINOR}, but this flux_dnn core speaks "
        rf"ABI {ABI.ABI_MAJOR}\.{ABI.ABI_MINOR}",
    ):
        _core.load_shim(library)
    with pytest.raises(OSError, match=rf"has ABI {major}\."):
        F.Shim(library)


def test_the_suite_checks_every_shim_flux_dnn_knows():
    """Every shim the installed packages register, as flux_dnn lists them, is one the suite
    checks (or skips with why it has no library)."""
    if os.environ.get("FLUX_DNN_SHIMS"):
        pytest.skip("FLUX_DNN_SHIMS pins which shims flux_dnn lists")
    listed = {s.name for s in flux_dnn.shims(load=False)}
    assert listed <= set(SOURCES), listed - set(SOURCES)


# ---------------------------------------------------------------------------------------------
# The table and the shim's self-description (every shim, usable here or not)


def test_table_is_the_headers_abi(shim):
    api = shim.api
    assert api.struct_size >= F.LAYOUT["FDNN_Api"]["struct_size"]
    assert (api.abi_major, api.abi_minor) == (ABI.ABI_MAJOR, ABI.ABI_MINOR)
    assert not api.extension_start
    for name in F.REQUIRED_FUNCTIONS:
        assert getattr(api, name), f"{name} is NULL"


def test_only_the_entry_point_is_exported(shim):
    """The header: a shim exports exactly one symbol, fdnn_get_api (no vendor or C++ runtime
    symbol leaks out to clash with another shim's)."""
    if shutil.which("nm") is None or not sys.platform.startswith("linux"):
        pytest.skip("lists ELF exports with nm, on Linux")
    out = subprocess.run(["nm", "-D", "--defined-only", shim.path], capture_output=True, text=True, check=True)
    assert [line.split()[-1] for line in out.stdout.splitlines()] == ["fdnn_get_api"]


def test_info_reports_itself_and_why_not(shim):
    info = shim.info()
    assert info.shim_name and info.vendor_name and info.vendor_version_built is not None
    assert info.vendor_version_runtime is not None
    assert info.shim_version.decode() == F.flux_dnn_version()
    assert ABI.PRIORITY_PORTABLE <= info.priority <= ABI.PRIORITY_VENDOR
    assert info.device_type in ABI.group("DEVICE_").values()
    if info.unavailable_reason is None:
        assert info.num_devices >= 1
    else:
        assert info.num_devices == 0 and info.unavailable_reason.decode().strip()


def test_the_core_loads_it_and_reads_the_same(shim):
    """What the suite checks is what flux_dnn's core loads: its loader accepts the table and
    reads the same self-description."""
    info = shim.info()
    core = _core.load_shim(shim.path).info()
    reason = info.unavailable_reason.decode() if info.unavailable_reason is not None else None
    assert (
        core["name"],
        core["priority"],
        core["device_type"],
        core["num_devices"],
        core["unavailable_reason"],
        core["shim_version"],
    ) == (
        info.shim_name.decode(),
        info.priority,
        info.device_type,
        info.num_devices,
        reason,
        info.shim_version.decode(),
    )


def test_info_from_many_threads_at_once(shim):
    """The header: Shim_Info is safe to call first and from any thread."""
    fields = ("shim_name", "vendor_version_runtime", "num_devices", "priority", "unavailable_reason")
    answers, start = [], threading.Barrier(8)

    def ask():
        start.wait()
        for _ in range(20):
            info = shim.info()
            answers.append(tuple(getattr(info, f) for f in fields))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 160 and len(set(answers)) == 1, set(answers)


def test_device_describe_and_default_flags(shim):
    info = shim.info()
    args = F.new(F.DeviceDescribeArgs, device_id=0)
    error = shim.call("Device_Describe", args)
    if info.unavailable_reason is not None:
        assert error is not None and error[0] == "UNAVAILABLE", error
        assert info.unavailable_reason.decode() in error[1]
        return
    assert error is None, error
    assert args.name
    known = ABI.CONV_DETERMINISTIC | ABI.CONV_ALLOW_REDUCED_PRECISION
    assert args.default_flags & ~known == 0
    # The header's rule: TF32 by default on NVIDIA, plain float32 on CPUs.
    expected = {ABI.DEVICE_CUDA: ABI.CONV_ALLOW_REDUCED_PRECISION, ABI.DEVICE_CPU: 0}
    if info.device_type in expected:
        assert args.default_flags == expected[info.device_type]


@pytest.mark.parametrize("device_id", ["num_devices", -1])
def test_device_describe_of_a_device_out_of_range_is_refused(shim, device_id):
    info = usable(shim)
    args = F.new(F.DeviceDescribeArgs, device_id=info.num_devices if device_id == "num_devices" else device_id)
    error = shim.call("Device_Describe", args)
    assert error is not None and error[0] == "INVALID_ARGUMENT", error
    assert args.name is None  # no out field written


# ---------------------------------------------------------------------------------------------
# struct_size and extensions, for every function of the table


def _valid_args(shim, function):
    """Args for `function` that it accepts on this shim, as far as the shim can run here, and
    a list of cleanups; skips when the shim lacks the function. Plans come from a float32
    forward problem with its NumPy arrays; where no plan can be made or executed (no device
    here; device memory), the plan is NULL."""
    if not getattr(shim.api, function):
        pytest.skip(f"{function} is NULL in this shim's table")
    if function == "Shim_Info":
        return F.new(F.ShimInfoArgs), None, []
    if function == "Device_Describe":
        return F.new(F.DeviceDescribeArgs, device_id=0), None, []
    if function == "Conv_Capabilities":
        float32 = F.DLDataType(*F.DTYPES["float32"], 1)
        return F.new(F.ConvCapabilitiesArgs, op=ABI.CONV_FORWARD, dtype=float32), None, []
    p = Problem(shim, bias=True)
    if function == "Conv_Plan_Create":
        return p.args, p, []
    can_plan = shim.reason() is None and (p.cpu or function == "Plan_Destroy")
    handle, size = plan(shim, p) if can_plan else (None, 0)
    if function == "Plan_Destroy":
        return F.new(F.PlanDestroyArgs, plan=handle), p, []
    cleanup = [lambda: shim.destroy(handle)]
    if function == "Conv_Plan_Execute":
        return p.execute_args(handle, size), p, cleanup
    return F.new(F.ConvPlanPackWeightsArgs, plan=handle, w=p.arrays["w"].ctypes.data, stream=p.stream), p, cleanup


def _with_struct_size(args, size):
    """A copy of an args struct (same type, same fields) with another struct_size."""
    copy = type(args).from_buffer_copy(args)
    copy.struct_size = size
    copy._keep = args
    return copy


SMALLER = {"last_field_missing": lambda cls: getattr(cls, cls._fields_[-1][0]).offset, "zero": lambda cls: 0}


@pytest.mark.parametrize("size", sorted(SMALLER))
@pytest.mark.parametrize("function", sorted(F.ARGS_OF))
def test_a_smaller_struct_size_is_refused(shim, function, size):
    """An older caller's struct (or garbage) is refused before anything is read or written."""
    args, _, cleanup = _valid_args(shim, function)
    try:
        small = _with_struct_size(args, SMALLER[size](type(args)))
        before = bytes(small)
        error = shim.call(function, small)
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "struct_size" in error[1], error
        assert bytes(small) == before  # no out field written
    finally:
        for step in cleanup:
            step()


def _newer(args):
    """args as a newer caller passes them: 64 more bytes of fields this header does not know
    (not zero: a callee must not read past its own struct), struct_size counting them, and a
    chain of two extensions of types no 2.0 shim knows."""

    class Newer(type(args)):
        _fields_ = [("appended_later", C.c_uint8 * 64)]

    newer = Newer.from_buffer_copy(bytes(args) + b"\xa5" * (C.sizeof(Newer) - C.sizeof(args)))
    second = F.new(F.ExtensionBase, type=0x7FFF0002)
    first = F.new(F.ExtensionBase, type=0x7FFF0001, next=C.pointer(second))
    newer.struct_size = C.sizeof(Newer)
    newer.extension_start = C.pointer(first)
    newer._keep = (args, first, second)
    return newer


OUT_FIELDS = {
    "Shim_Info": ("shim_name", "shim_version", "device_type", "num_devices", "priority", "unavailable_reason"),
    "Device_Describe": ("default_flags", "name"),
    "Conv_Capabilities": ("support", "spatial_ranks", "activations", "features", "detail"),
    "Conv_Plan_Create": ("workspace_size",),
}


@pytest.mark.parametrize("function", sorted(F.ARGS_OF))
def test_a_newer_callers_struct_and_extensions_are_accepted(shim, function):
    """A larger struct_size and unknown extensions change nothing: the same answer (or the
    same error) as the header's own struct; what it computes so is right."""
    args, problem, cleanup = _valid_args(shim, function)
    try:
        newer = _newer(args)
        error = shim.call(function, newer)
        if function == "Conv_Plan_Execute" and error is None:
            check_result(problem)  # the first execution: into the poisoned output
        expected = shim.call(function, args)
        assert (error and error[0]) == (expected and expected[0]), (error, expected)
        for field in OUT_FIELDS.get(function, ()):
            assert getattr(newer, field) == getattr(args, field), field
        if function == "Conv_Plan_Create" and error is None:
            shim.destroy(args.plan)
            handle = newer.plan
            cleanup.append(lambda: shim.destroy(handle))
            if problem.cpu:
                assert shim.call("Conv_Plan_Execute", problem.execute_args(handle, newer.workspace_size)) is None
                check_result(problem)
        if function == "Conv_Plan_Pack_Weights" and error is None:
            for packed in (newer.packed_plan, args.packed_plan):
                cleanup.append(lambda packed=packed: shim.destroy(packed))
    finally:
        for step in cleanup:
            step()


@pytest.mark.parametrize("function", sorted(F.VOID_ARGS_OF))
def test_a_newer_callers_struct_for_the_void_functions(shim, function):
    """Error_Describe, Error_Destroy and Plan_Destroy with a newer caller's struct: the same
    description; the error or plan freed (nothing to see here but no crash; a leak checker
    would see a leak)."""
    if function == "Plan_Destroy":
        args, _, _ = _valid_args(shim, "Plan_Destroy")  # a plan where the shim can make one
        shim.call_void("Plan_Destroy", _newer(args))
        return
    error = raw_error(shim, "Shim_Info", F.ShimInfoArgs(struct_size=0))
    if function == "Error_Destroy":
        shim.call_void("Error_Destroy", _newer(F.new(F.ErrorDestroyArgs, error=error)))
        return
    described, newer = F.new(F.ErrorDescribeArgs, error=error), _newer(F.new(F.ErrorDescribeArgs, error=error))
    shim.call_void("Error_Describe", described)
    shim.call_void("Error_Describe", newer)
    shim.call_void("Error_Destroy", F.new(F.ErrorDestroyArgs, error=error))
    assert (newer.code, newer.message, newer.message_size) == (
        described.code,
        described.message,
        described.message_size,
    )


# ---------------------------------------------------------------------------------------------
# NULL pointers, destroy of NULL, error objects


@pytest.mark.parametrize("function", sorted(F.ARGS_OF))
def test_null_args_are_refused(shim, function):
    """args NULL: INVALID_ARGUMENT, not a crash. (The header says every function takes one
    args struct; the shims hold NULL for a caller's mistake like any other.)"""
    if not getattr(shim.api, function):
        pytest.skip(f"{function} is NULL in this shim's table")
    error = shim.call(function, None)
    assert error is not None and error[0] == "INVALID_ARGUMENT", error


def test_destroy_of_null_is_a_no_op(shim):
    shim.call_void("Plan_Destroy", F.new(F.PlanDestroyArgs, plan=None))
    shim.call_void("Error_Destroy", F.new(F.ErrorDestroyArgs, error=None))


def test_execute_and_pack_of_a_null_plan_are_refused(shim):
    p = Problem(shim, bias=True)
    error = shim.call("Conv_Plan_Execute", p.execute_args(None, 0))
    assert error is not None and error[0] == "INVALID_ARGUMENT" and "plan" in error[1], error
    if shim.api.Conv_Plan_Pack_Weights:
        error = shim.call(
            "Conv_Plan_Pack_Weights",
            F.new(F.ConvPlanPackWeightsArgs, plan=None, w=p.arrays["w"].ctypes.data, stream=p.stream),
        )
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "plan" in error[1], error


def _errors_of_every_kind(shim) -> dict:
    """{kind: raw FDNN_Error*} of the error kinds this shim gives here: a caller's mistake,
    and UNAVAILABLE (no device) or UNSUPPORTED (a dtype it does not compute)."""
    raw = {"INVALID_ARGUMENT": raw_error(shim, "Shim_Info", F.ShimInfoArgs(struct_size=0))}
    int32 = F.new(F.ConvCapabilitiesArgs, op=ABI.CONV_FORWARD, dtype=F.DLDataType(ABI.DTYPE_INT, 32, 1))
    if shim.reason() is not None:
        raw["UNAVAILABLE"] = raw_error(shim, "Device_Describe", F.new(F.DeviceDescribeArgs))
    elif shim.call("Conv_Capabilities", int32) is None and int32.support == ABI.SUPPORT_NONE:
        p = Problem(shim)
        for t in p.descriptors.values():
            t.dtype, t.data = F.DLDataType(ABI.DTYPE_INT, 32, 1), None
        raw["UNSUPPORTED"] = raw_error(shim, "Conv_Plan_Create", p.args)
    return raw


def test_error_objects_are_as_the_header_says(shim):
    """Code in FDNN_ERROR_*, message UTF-8, not empty, NUL-terminated at message_size, owned
    by the error and the same for as long as it lives; Error_Destroy frees it."""
    for kind, error in _errors_of_every_kind(shim).items():
        assert error, f"no {kind} error"
        first, again = F.new(F.ErrorDescribeArgs, error=error), F.new(F.ErrorDescribeArgs, error=error)
        shim.call_void("Error_Describe", first)
        text = C.string_at(first.message, first.message_size)
        shim.call_void("Error_Describe", again)
        try:
            assert F.error_problems(first) == [], kind
            assert F.ERROR_NAMES[first.code] == kind
            assert (again.code, again.message, again.message_size) == (first.code, first.message, first.message_size)
            assert C.string_at(again.message, again.message_size) == text
        finally:
            shim.call_void("Error_Destroy", F.new(F.ErrorDestroyArgs, error=error))


# ---------------------------------------------------------------------------------------------
# Capabilities


@pytest.mark.parametrize("op", [-1, ABI.NUM_CONV_OPS, 1 << 20, -(1 << 31)])
def test_capabilities_of_an_op_out_of_range_are_refused(shim, op):
    args = F.new(F.ConvCapabilitiesArgs, op=op, dtype=F.DLDataType(*F.DTYPES["float32"], 1))
    error = shim.call("Conv_Capabilities", args)
    assert_refused(shim, error, "INVALID_ARGUMENT", f"op {op}")
    assert args.detail is None  # no out field written


@pytest.mark.parametrize("device_id", ["num_devices", -1])
def test_capabilities_of_a_device_out_of_range_are_refused(shim, device_id):
    info = usable(shim)
    error = shim.capabilities(
        ABI.CONV_FORWARD, F.DTYPES["float32"], device_id=info.num_devices if device_id == "num_devices" else device_id
    )
    assert isinstance(error, tuple) and error[0] == "INVALID_ARGUMENT", error


@pytest.mark.parametrize("op", sorted(OPS))
def test_capabilities_and_plans_without_a_device_say_why(shim, op):
    info = shim.info()
    if info.unavailable_reason is None:
        pytest.skip("usable here")
    reason = info.unavailable_reason.decode()
    error = shim.capabilities(OPS[op], F.DTYPES["float32"])
    assert isinstance(error, tuple) and error[0] == "UNAVAILABLE" and reason in error[1], error
    p = Problem(shim, op=op)
    p.args.plan = 12345
    error = shim.call("Conv_Plan_Create", p.args)
    assert error is not None and error[0] == "UNAVAILABLE" and reason in error[1], error
    assert p.args.plan == 12345


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", sorted(ALL_DTYPES))
def test_capabilities_are_well_formed(shim, op, dtype):
    usable(shim)
    caps = shim.capabilities(OPS[op], ALL_DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    assert caps.support in ABI.group("SUPPORT_").values()
    assert caps.detail is not None
    if caps.support == ABI.SUPPORT_NONE:
        assert (caps.spatial_ranks, caps.activations, caps.features) == (0, 0, 0)
        assert caps.detail.strip(), "a dtype not computed says why"
        return
    every_rank = sum(1 << r for r in range(1, ABI.MAX_SPATIAL_DIMS + 1))
    assert caps.spatial_ranks and caps.spatial_ranks & ~every_rank == 0
    assert caps.activations & (1 << ABI.ACTIVATION_NONE)
    assert caps.activations >> ABI.NUM_ACTIVATIONS == 0
    if OPS[op] != ABI.CONV_FORWARD:
        assert caps.activations == 1 << ABI.ACTIVATION_NONE
    assert caps.features & ~sum(FEATURES.values()) == 0
    if caps.features & ABI.FEATURE_PACK_WEIGHTS:
        assert shim.api.Conv_Plan_Pack_Weights and OPS[op] == ABI.CONV_FORWARD
    if caps.features & ABI.FEATURE_BIAS_GRADIENT:
        assert OPS[op] == ABI.CONV_BACKWARD_WEIGHT  # the feature of that op alone


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", sorted(ALL_DTYPES))
def test_a_dtype_not_computed_is_unsupported_at_plan_create(shim, op, dtype):
    usable(shim)
    caps = shim.capabilities(OPS[op], ALL_DTYPES[dtype])
    if caps.support != ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} is computed ({caps.detail.decode()})")
    p = Problem(shim, op=op)
    for t in p.descriptors.values():
        t.dtype = F.DLDataType(*ALL_DTYPES[dtype], 1)
        t.data = None
    p.args.plan = 12345
    error = shim.call("Conv_Plan_Create", p.args)
    assert error is not None and error[0] == "UNSUPPORTED", error
    assert p.args.plan == 12345  # no out field written


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", sorted(F.DTYPES))
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_each_reported_rank_is_served(shim, op, dtype, rank):
    caps = served(shim, OPS[op], dtype)
    p = Problem(shim, op=op, dtype=dtype, rank=rank, bias=OPS[op] == ABI.CONV_FORWARD)
    if not caps.spatial_ranks & (1 << rank):
        p.args.plan = 12345
        error = shim.call("Conv_Plan_Create", p.args)
        assert error is not None and error[0] == "UNSUPPORTED", error
        return
    if p.cpu:
        run_and_check(shim, p)
    else:
        shim.destroy(plan(shim, p)[0])


@pytest.mark.parametrize("dtype", sorted(F.DTYPES))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_each_reported_activation_is_fused(shim, dtype, activation):
    caps = served(shim, ABI.CONV_FORWARD, dtype)
    act_a, act_b = {"leaky_relu": (0.125, 0.0), "clip": (-0.5, 0.75)}.get(activation, (0.0, 0.0))
    p = Problem(shim, dtype=dtype, bias=True, activation=activation, act_a=act_a, act_b=act_b)
    if not caps.activations & (1 << ACTIVATIONS[activation]):
        error = shim.call("Conv_Plan_Create", p.args)
        assert error is not None and error[0] == "UNSUPPORTED", error
    elif p.cpu:
        run_and_check(shim, p)
    else:
        shim.destroy(plan(shim, p)[0])


# Per feature: the problem that asks for it, and whether a shim that does not report it must
# refuse it (a requirement) or may serve it without (an allowance or a hint).
FEATURE_PROBLEMS = {
    "GROUPS": (dict(groups=2), True),
    "DILATION": (dict(dilation=2, lo=2, hi=1), True),
    "ALPHA_BETA": (dict(alpha=0.5, beta=0.75), True),
    "BIAS_GRADIENT": (dict(op="backward_weight", bias=True), True),
    "ASYMMETRIC_PADDING": (dict(lo=2, hi=0), False),  # every shim serves it; the bit says how
    "DETERMINISTIC": (dict(flags=ABI.CONV_DETERMINISTIC), True),
    "BENCHMARK": (dict(policy=ABI.ALGO_BENCHMARK), False),
    "REDUCED_PRECISION": (dict(flags=ABI.CONV_ALLOW_REDUCED_PRECISION), False),
}


def test_every_feature_of_the_header_has_a_problem():
    """A feature bit added to the header needs its problem here (this is the one list)."""
    assert set(FEATURE_PROBLEMS) | {"PACK_WEIGHTS"} == set(FEATURES)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("feature", sorted(FEATURE_PROBLEMS))
def test_each_feature_is_served_as_reported(shim, op, dtype, feature):
    kw, required = FEATURE_PROBLEMS[feature]
    if kw.get("op", op) != op:
        pytest.skip(f"{feature} concerns {kw['op']} only")
    caps = served(shim, OPS[op], dtype)
    kw = dict(kw, op=op, bias=kw.get("bias", op == "forward"))
    p = Problem(shim, dtype=dtype, **kw)
    if required and not caps.features & FEATURES[feature]:
        error = shim.call("Conv_Plan_Create", p.args)
        assert error is not None and error[0] == "UNSUPPORTED", error
        return
    if p.cpu and not (feature == "REDUCED_PRECISION" and caps.features & FEATURES[feature]):
        run_and_check(shim, p)  # (reduced precision, where it changes the math, is not exact)
    else:
        shim.destroy(plan(shim, p)[0])


def _sampled_problem(index: int) -> dict:
    """Problem options drawn from every axis capabilities speak of (op, dtype, rank, groups,
    dilation, alpha/beta, activation, bias gradient, the deterministic flag), fixed by index."""
    rng = np.random.default_rng(1000 + index)

    def pick(*values):
        return values[rng.integers(len(values))]

    op = pick(*OPS)
    return dict(
        op=op,
        dtype=pick(*F.DTYPES),
        rank=pick(1, 2, 3),
        groups=pick(1, 2),
        dilation=pick(1, 1, 2),
        stride=pick(1, 2),
        alpha=pick(1.0, 1.0, 0.5),
        beta=pick(0.0, 0.0, 0.25),
        activation=pick("none", *ACTIVATIONS) if op == "forward" else "none",
        bias=op != "backward_data" and pick(False, True),
        flags=pick(0, 0, ABI.CONV_DETERMINISTIC),
        seed=index,
    )


def _covered(caps, kw) -> bool:
    """Whether capabilities cover a problem: what plan creation must then accept."""
    if caps.support == ABI.SUPPORT_NONE:
        return False
    asks = {
        "GROUPS": kw["groups"] > 1,
        "DILATION": kw["dilation"] > 1,
        "ALPHA_BETA": kw["alpha"] != 1 or kw["beta"] != 0,
        "BIAS_GRADIENT": kw["op"] == "backward_weight" and kw["bias"],
        "DETERMINISTIC": bool(kw["flags"] & ABI.CONV_DETERMINISTIC),
    }
    return (
        bool(caps.spatial_ranks & (1 << kw["rank"]))
        and bool(caps.activations & (1 << ACTIVATIONS[kw["activation"]]))
        and all(caps.features & FEATURES[name] for name, asked in asks.items() if asked)
    )


@pytest.mark.parametrize("index", range(24))
def test_plan_creation_accepts_exactly_what_capabilities_cover(shim, index):
    """Both directions, on problems that mix the axes: a covered problem is planned (and on a
    CPU shim computed right), one not covered is UNSUPPORTED, nothing written."""
    usable(shim)
    kw = _sampled_problem(index)
    caps = shim.capabilities(OPS[kw["op"]], F.DTYPES[kw["dtype"]])
    assert not isinstance(caps, tuple), caps
    p = Problem(shim, **kw)
    if not _covered(caps, kw):
        p.args.plan = 12345
        error = shim.call("Conv_Plan_Create", p.args)
        assert error is not None and error[0] == "UNSUPPORTED", (kw, error)
        assert p.args.plan == 12345
    elif p.cpu:
        run_and_check(shim, p)
    else:
        shim.destroy(plan(shim, p)[0])


@pytest.mark.parametrize("op", sorted(OPS))
def test_pack_weights_as_reported(shim, op):
    caps = served(shim, OPS[op], "float32")
    if not shim.api.Conv_Plan_Pack_Weights:
        assert not caps.features & ABI.FEATURE_PACK_WEIGHTS
        pytest.skip("Conv_Plan_Pack_Weights is NULL in this shim's table (it reports no FEATURE_PACK_WEIGHTS)")
    p = Problem(shim, op=op)
    handle, size = plan(shim, p)
    try:
        pack = F.new(
            F.ConvPlanPackWeightsArgs, plan=handle, w=p.arrays["w"].ctypes.data if p.cpu else None, stream=p.stream
        )
        error = shim.call("Conv_Plan_Pack_Weights", pack)
        if not caps.features & ABI.FEATURE_PACK_WEIGHTS:
            assert error is not None and error[0] == "INVALID_ARGUMENT", error
            return
        assert error is None, error
        if p.cpu:
            w_seen = p.values["w"]
            p.arrays["w"][...] = np.nan  # the packed plan reads its own copy
            try:
                ex = p.execute_args(pack.packed_plan, pack.workspace_size, w=None)
                assert shim.call("Conv_Plan_Execute", ex) is None
            finally:
                p.arrays["w"][...] = w_seen
            check_result(p)
        shim.destroy(pack.packed_plan)
    finally:
        shim.destroy(handle)


# ---------------------------------------------------------------------------------------------
# The header's rules for Conv_Plan_Create: INVALID_ARGUMENT naming the field, before any work


def _null_field(field):
    def change(p):
        setattr(p.args, field, C.POINTER(F.DLTensor)())

    return change


def _null_array(tensor, field):
    def change(p):
        setattr(p.descriptors[tensor], field, C.POINTER(C.c_int64)())

    return change


def _set(field, value, index=None):
    def change(p):
        if index is None:
            setattr(p.args, field, value)
        else:
            getattr(p.args, field)[index] = value

    return change


def _misalign(tensor):
    def change(p):
        p.descriptors[tensor].data = p.descriptors[tensor].data or 4096
        p.descriptors[tensor].byte_offset = 1

    return change


RULES = {  # case: (change, words the message must hold)
    # enum fields out of range
    "op_3": (_set("op", 3), "op 3"),
    "op_negative": (_set("op", -1), "op -1"),
    "op_int32_min": (_set("op", -(1 << 31)), f"op {-(1 << 31)}"),
    "activation_9": (_set("activation", 9), "activation 9"),
    "activation_negative": (_set("activation", -1), "activation -1"),
    "activation_huge": (_set("activation", 1 << 30), f"activation {1 << 30}"),
    "algo_policy_3": (_set("algo_policy", 3), "algo_policy 3"),
    "algo_policy_negative": (_set("algo_policy", -1), "algo_policy -1"),
    "spatial_rank_0": (_set("spatial_rank", 0), "spatial_rank 0"),
    "spatial_rank_4": (_set("spatial_rank", 4), "spatial_rank 4"),
    # NULL descriptors, shapes and strides
    **{f"{t}_null": (_null_field(t), f"{t} is NULL") for t in ("x", "w", "y", "bias")},
    **{
        f"{t}_{a}_null": (_null_array(t, a), f"NULL {a}") for t in ("x", "w", "y", "bias") for a in ("shape", "strides")
    },
    # geometry
    "stride_0": (_set("stride", 0, 1), "stride[1] is 0"),
    "stride_negative": (_set("stride", -2, 0), "stride[0] is -2"),
    "dilation_0": (_set("dilation", 0, 0), "dilation[0] is 0"),
    "padding_lo_negative": (_set("padding_lo", -1, 1), "padding_lo[1] is -1"),
    "padding_hi_negative": (_set("padding_hi", -3, 0), "padding_hi[0] is -3"),
    "groups_0": (_set("groups", 0), "groups is 0"),
    # alignment of data + byte_offset
    "x_misaligned": (_misalign("x"), "not aligned"),
    "y_misaligned": (_misalign("y"), "not aligned"),
    "activation_on_backward": (_set("op", 1), "forward only"),
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_invalid_arguments_are_refused_naming_the_field(shim, case):
    p = Problem(shim, bias=True, activation="relu" if case == "activation_on_backward" else "none")
    if case == "activation_on_backward":
        p.args.bias = C.pointer(F.DLTensor(ndim=0))
    change, words = RULES[case]
    change(p)
    p.args.plan, p.args.workspace_size, p.args.chosen_algo_id = 12345, 777, -5
    error = shim.call("Conv_Plan_Create", p.args)
    assert_refused(shim, error, "INVALID_ARGUMENT", words)
    assert (p.args.plan, p.args.workspace_size, p.args.chosen_algo_id) == (12345, 777, -5)


def test_stride_zero_on_every_dim_is_refused_before_any_division(shim):
    """The output size divides by the stride: a shim must refuse stride 0 first (a SIGFPE
    here ends the test process)."""
    for rank in (1, 2, 3):
        p = Problem(shim, rank=rank)
        for i in range(rank):
            p.args.stride[i] = 0
        error = shim.call("Conv_Plan_Create", p.args)
        assert_refused(shim, error, "INVALID_ARGUMENT", "stride[0] is 0")


# ---------------------------------------------------------------------------------------------
# Execute


@pytest.mark.parametrize("pointer", ["x", "w", "y", "bias"])
def test_execute_refuses_a_pointer_not_aligned_to_the_element(shim, pointer):
    on_cpu(shim)
    p = Problem(shim, bias=True)
    handle, size = plan(shim, p)
    try:
        misaligned = {pointer: p.arrays[pointer].ctypes.data + 1}
        error = shim.call("Conv_Plan_Execute", p.execute_args(handle, size, **misaligned))
        assert error is not None and error[0] == "INVALID_ARGUMENT", error
        assert pointer in error[1] and "aligned" in error[1], error
        assert np.isnan(p.arrays["y"]).all()  # nothing written
    finally:
        shim.destroy(handle)


THREADS, RUNS = 4, 5


def test_one_plan_executes_on_several_threads_at_once(shim):
    """The header: a plan may execute on several threads at once. Each thread has its own
    operands (other values, same shapes) and output; each output is its own convolution."""
    on_cpu(shim)
    problems = [Problem(shim, bias=True, seed=1 + i) for i in range(THREADS)]
    handle, size = plan(shim, problems[0])
    errors, start = [], threading.Barrier(THREADS)

    def work(p):
        start.wait()
        for _ in range(RUNS):
            errors.append(shim.call("Conv_Plan_Execute", p.execute_args(handle, size)))

    threads = [threading.Thread(target=work, args=(p,)) for p in problems]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shim.destroy(handle)
    assert errors == [None] * (THREADS * RUNS)
    for p in problems:
        check_result(p)
    outputs = [p.result() for p in problems]
    assert all(not np.array_equal(outputs[0], other) for other in outputs[1:])  # no thread saw another's data

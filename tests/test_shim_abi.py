"""The ABI 2.0 contract, checked on every shim library through ctypes (below the core).

Generic over the shim: each test takes a library path (fdnn_ctypes.shim_libraries():
FLUX_DNN_<NAME>_SHIM, else the libraries installed with flux_dnn and its plug-ins) and
asserts only what csrc/include/flux_dnn/flux_dnn.h says, driven by what the shim reports
(Shim_Info, Conv_Capabilities). A shim that cannot run here (no driver, no device) is still
loaded and must say why; the tests that need it to plan skip with that reason. Execution
tests run on CPU shims (device arrays of other devices need an array library; the
conformance suites cover those)."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
import threading

import numpy as np
import pytest

import fdnn_ctypes as F
import reference as ref
from fdnn_ctypes import ABI

LIBRARIES = F.shim_libraries()
FEATURES = ABI.group("FEATURE_")
ACTIVATIONS = {name.lower(): value for name, value in ABI.group("ACTIVATION_").items()}
OPS = {"forward": ABI.CONV_FORWARD, "backward_data": ABI.CONV_BACKWARD_DATA,
       "backward_weight": ABI.CONV_BACKWARD_WEIGHT}
NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16}
SHIMS = pytest.mark.parametrize("shim", sorted(LIBRARIES) or [pytest.param(None, marks=pytest.mark.skip(
    reason="no shim library found: build one and set FLUX_DNN_<NAME>_SHIM, or install flux_dnn"))],
    indirect=True)


@pytest.fixture(scope="module")
def shim(request) -> F.Shim:
    F.preload_vendor_libraries()
    return F.Shim(LIBRARIES[request.param])


def usable(shim) -> F.ShimInfoArgs:
    """Shim_Info of a shim that can plan here; skips with its own reason otherwise."""
    info = shim.info()
    if info.unavailable_reason is not None:
        pytest.skip(f"{info.shim_name.decode()} cannot run here: {info.unavailable_reason.decode()}")
    return info


def on_cpu(shim) -> None:
    if usable(shim).device_type != ABI.DEVICE_CPU:
        pytest.skip("executes on CPU shims only: device arrays need an array library (conformance suite)")


# ---------------------------------------------------------------------------------------------
# Problems


class Problem:
    """One small convolution with NumPy arrays for every operand (data pointers at plan time
    on CPU shims; descriptors only elsewhere), NaN-poisoned output, and its reference."""

    def __init__(self, shim, *, op="forward", dtype="float32", rank=2, groups=1, dilation=1, stride=1,
                 lo=1, hi=1, bias=False, alpha=1.0, beta=0.0, activation="none", act_a=0.0, act_b=0.0,
                 flags=0, policy=0, seed=0):
        info = shim.info()
        self.cpu = info.device_type == ABI.DEVICE_CPU
        self.device = (info.device_type, 0)
        self.op, self.dtype, self.rank = OPS[op], dtype, rank
        rng = np.random.default_rng(seed)
        C_, K = 2 * groups, 3 * groups
        sp = (7, 6, 5)[:rank]
        ks = (3, 2, 3)[:rank]
        self.geo = dict(stride=(stride,) * rank, dilation=(dilation,) * rank, lo=(lo,) * rank, hi=(hi,) * rank,
                        groups=groups)
        osp = tuple(ref.out_size(sp[i], ks[i], stride, dilation, lo, hi) for i in range(rank))
        # Quarters in [-1, 1]: exact in every dtype, so 16-bit results differ by one rounding.
        self.values = {name: rng.integers(-4, 5, size=shape) / 4.0 for name, shape in
                       (("x", (2, C_, *sp)), ("w", (K, C_ // groups, *ks)), ("y", (2, K, *osp)), ("bias", (K,)))}
        if not bias:
            del self.values["bias"]
        storage = NUMPY.get(dtype, np.uint16)
        self.arrays = {name: self._store(v, storage) for name, v in self.values.items()}
        self.out = {ABI.CONV_FORWARD: "y", ABI.CONV_BACKWARD_DATA: "x", ABI.CONV_BACKWARD_WEIGHT: "w"}[self.op]
        self.writes_bias = bias and self.op == ABI.CONV_BACKWARD_WEIGHT
        for name in (self.out, "bias") if beta == 0 else ():
            if name == self.out or self.writes_bias:
                self.arrays[name][...] = self._store(np.full(self.arrays[name].shape, np.nan), storage)
        code, bits = F.DTYPES[dtype]
        keep = []
        descriptors = {name: self._descriptor(self.arrays.get(name), (code, bits), keep)
                       for name in ("x", "w", "y", "bias")}
        self.args = F.new(F.ConvPlanCreateArgs, op=self.op, spatial_rank=rank, groups=groups, alpha=alpha,
                          beta=beta, activation=ACTIVATIONS[activation], activation_alpha=act_a,
                          activation_beta=act_b, flags=flags, algo_policy=policy,
                          workspace_limit=C.c_size_t(-1).value,
                          **{name: C.pointer(d) for name, d in descriptors.items()})
        for i in range(rank):
            self.args.stride[i], self.args.dilation[i] = stride, dilation
            self.args.padding_lo[i], self.args.padding_hi[i] = lo, hi
        self.descriptors, self._keep = descriptors, keep
        self.alpha, self.beta, self.activation, self.act = alpha, beta, activation, (act_a, act_b)

    @staticmethod
    def _store(values, storage):
        if storage is np.uint16:  # bfloat16 bits, rounded to nearest even
            u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return np.asarray(values).astype(storage)

    def _descriptor(self, a, dtype, keep):
        if a is None:
            return F.DLTensor(ndim=0)
        shape = (C.c_int64 * a.ndim)(*a.shape)
        strides = (C.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
        keep += [shape, strides]
        return F.DLTensor(data=a.ctypes.data if self.cpu else None, device=F.DLDevice(*self.device), ndim=a.ndim,
                          dtype=F.DLDataType(dtype[0], dtype[1], 1), shape=shape, strides=strides)

    def execute_args(self, plan, workspace_size, **pointers):
        raw = np.empty(workspace_size + 64, np.uint8)
        ws = raw.ctypes.data + (-raw.ctypes.data) % 64
        fields = {name: a.ctypes.data for name, a in self.arrays.items()}
        fields.update(pointers)
        args = F.new(F.ConvPlanExecuteArgs, plan=plan, workspace=ws if workspace_size else None,
                     workspace_size=workspace_size, **fields)
        args._keep = raw
        return args

    def expected(self):
        v = self.values
        g = dict(self.geo)
        if self.op == ABI.CONV_FORWARD:
            r = ref.conv_forward(v["x"], v["w"], v.get("bias"), **g)
            r = self.alpha * r
            if self.activation != "none":
                r = _activation_ref(r, self.activation, *self.act)
        elif self.op == ABI.CONV_BACKWARD_DATA:
            r = self.alpha * ref.conv_backward_data(v["y"], v["w"], v["x"].shape, **g)
        else:
            r = self.alpha * ref.conv_backward_weight(v["x"], v["y"], v["w"].shape, **g)
        return r + self.beta * v[self.out] if self.beta else r

    def bias_gradient_expected(self):
        """db of a backward-weight problem with a bias: alpha * sum of dy + beta * db_old."""
        axes = (0, *range(2, self.rank + 2))
        r = self.alpha * self.values["y"].sum(axis=axes)
        return r + self.beta * self.values["bias"] if self.beta else r

    def result(self, name=None):
        a = self.arrays[name or self.out]
        if a.dtype == np.uint16:
            return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return a.astype(np.float64)


def _activation_ref(v, name, a, b):
    import math

    return {"relu": lambda: np.maximum(v, 0), "leaky_relu": lambda: np.where(v >= 0, v, a * v),
            "clip": lambda: np.clip(v, a, b), "sigmoid": lambda: 1 / (1 + np.exp(-v)), "tanh": lambda: np.tanh(v),
            "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
            "gelu_erf": lambda: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
            "silu": lambda: v / (1 + np.exp(-v))}[name]()


TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def plan(shim, problem):
    error = shim.call("Conv_Plan_Create", problem.args)
    assert error is None, error
    return problem.args.plan, problem.args.workspace_size


def run_and_check(shim, problem):
    """Plans, executes once, destroys, and compares with the float64 reference."""
    handle, size = plan(shim, problem)
    try:
        assert shim.call("Conv_Plan_Execute", problem.execute_args(handle, size)) is None
    finally:
        shim.destroy(handle)
    tol = TOLERANCE[problem.dtype]
    checks = [(problem.out, problem.expected())]
    if problem.writes_bias:
        checks.append(("bias", problem.bias_gradient_expected()))
    for name, expected in checks:
        np.testing.assert_allclose(problem.result(name), expected, rtol=tol,
                                   atol=tol * max(1.0, np.abs(expected).max()), err_msg=name)


def served(shim, op, dtype):
    """The capabilities of (op, dtype) on device 0; skips when the shim cannot run here or
    does not compute it."""
    usable(shim)
    caps = shim.capabilities(op, F.DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    if caps.support == ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} is not computed: {caps.detail.decode()}")
    return caps


# ---------------------------------------------------------------------------------------------
# The header and the mirrors


def test_ctypes_mirrors_match_the_header():
    assert F.mirror_mismatches() == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("std", ["c99", "c11", "c++17"])
def test_header_compiles_and_struct_sizes_match_the_mirrors(tmp_path, std):
    """The header builds as C99, C11 and C++ with every warning an error (its compile-time
    checks included), and its FDNN_*_STRUCT_SIZE are the mirrors' sizes."""
    source = tmp_path / "sizes.c"
    source.write_text("#include <stdio.h>\n#include \"flux_dnn/flux_dnn.h\"\nint main(void) {\n" + "".join(
        f'  printf("{name} %d\\n", (int){name}_STRUCT_SIZE);\n' for name in F.MIRRORS
        if name not in ("FDNN_DLDevice", "FDNN_DLDataType", "FDNN_DLTensor")) + "  return 0;\n}\n")
    compiler = ["c++", "-x", "c++"] if std.startswith("c++") else ["cc"]
    exe = tmp_path / "sizes"
    subprocess.run(compiler + [f"-std={std}", "-Wall", "-Wextra", "-pedantic", "-Werror",
                               f"-I{F.HEADER.parent.parent}", str(source), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    sizes = dict(zip(out[::2], map(int, out[1::2])))
    assert sizes == {name: F.struct_size(F.MIRRORS[name]) for name in sizes}


# ---------------------------------------------------------------------------------------------
# The table and the shim's self-description (every shim, usable here or not)


@SHIMS
def test_table_is_the_headers_abi(shim):
    api = shim.api
    assert api.struct_size == F.struct_size(F.Api)
    assert (api.abi_major, api.abi_minor) == (ABI.ABI_MAJOR, ABI.ABI_MINOR)
    assert not api.extension_start
    for name in F.FUNCTIONS:
        assert getattr(api, name), f"{name} is NULL"


@SHIMS
def test_info_reports_version_priority_and_why_not(shim):
    info = shim.info()
    assert info.shim_name and info.vendor_name and info.vendor_version_built is not None
    assert info.shim_version.decode() == F.flux_dnn_version()
    assert ABI.PRIORITY_PORTABLE <= info.priority <= ABI.PRIORITY_VENDOR
    assert info.device_type in ABI.group("DEVICE_").values()
    if info.unavailable_reason is None:
        assert info.num_devices >= 1
    else:
        assert info.num_devices == 0 and info.unavailable_reason.decode().strip()


@SHIMS
@pytest.mark.parametrize("function", sorted(F.ARGS_OF))
def test_small_struct_size_is_refused(shim, function):
    if not getattr(shim.api, function):
        pytest.skip(f"{function} is NULL in this shim's table")
    args = F.ARGS_OF[function](struct_size=F.struct_size(F.ARGS_OF[function]) - 1)
    error = shim.call(function, args)
    assert error is not None and error[0] == "INVALID_ARGUMENT" and "struct_size" in error[1], error


@SHIMS
def test_larger_struct_size_and_unknown_extensions_are_accepted(shim):
    """A newer caller: a larger struct, and an extension of a type this shim does not know."""

    class NewerInfoArgs(C.Structure):
        _fields_ = F.ShimInfoArgs._fields_ + [("appended_later", C.c_void_p * 4)]

    unknown = F.new(F.ExtensionBase, type=0x7FFF0001)
    args = NewerInfoArgs(struct_size=C.sizeof(NewerInfoArgs), extension_start=C.pointer(unknown))
    assert shim.call("Shim_Info", args) is None
    assert args.shim_name == shim.info().shim_name


@SHIMS
def test_destroy_of_null_is_a_no_op(shim):
    shim.call_void("Plan_Destroy", F.new(F.PlanDestroyArgs, plan=None))
    shim.call_void("Error_Destroy", F.new(F.ErrorDestroyArgs, error=None))


@SHIMS
def test_execute_and_pack_of_a_null_plan_are_refused(shim):
    error = shim.call("Conv_Plan_Execute", F.new(F.ConvPlanExecuteArgs, plan=None))
    assert error is not None and error[0] == "INVALID_ARGUMENT" and "plan" in error[1], error
    if shim.api.Conv_Plan_Pack_Weights:
        error = shim.call("Conv_Plan_Pack_Weights", F.new(F.ConvPlanPackWeightsArgs, plan=None, w=64))
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "plan" in error[1], error


@SHIMS
def test_device_describe_and_default_flags(shim):
    info = shim.info()
    args = F.new(F.DeviceDescribeArgs, device_id=0)
    error = shim.call("Device_Describe", args)
    if info.unavailable_reason is not None:
        assert error is not None and error[0] == "UNAVAILABLE", error
        return
    assert error is None, error
    assert args.name
    known = ABI.CONV_DETERMINISTIC | ABI.CONV_ALLOW_REDUCED_PRECISION
    assert args.default_flags & ~known == 0
    # The header's rule: TF32 by default on NVIDIA, plain float32 on CPUs.
    expected = {ABI.DEVICE_CUDA: ABI.CONV_ALLOW_REDUCED_PRECISION, ABI.DEVICE_CPU: 0}
    if info.device_type in expected:
        assert args.default_flags == expected[info.device_type]
    bad = F.new(F.DeviceDescribeArgs, device_id=info.num_devices)
    error = shim.call("Device_Describe", bad)
    assert error is not None and error[0] == "INVALID_ARGUMENT", error


# ---------------------------------------------------------------------------------------------
# Capabilities


@SHIMS
@pytest.mark.parametrize("op", [-1, 3, 1 << 20])
def test_capabilities_of_an_unknown_op_are_refused(shim, op):
    usable(shim)
    error = shim.capabilities(op, F.DTYPES["float32"])
    assert isinstance(error, tuple) and error[0] == "INVALID_ARGUMENT" and f"op {op}" in error[1], error


@SHIMS
def test_capabilities_of_a_device_out_of_range_are_refused(shim):
    info = usable(shim)
    error = shim.capabilities(ABI.CONV_FORWARD, F.DTYPES["float32"], device_id=info.num_devices)
    assert isinstance(error, tuple) and error[0] == "INVALID_ARGUMENT", error


@SHIMS
def test_capabilities_without_a_device_say_why(shim):
    info = shim.info()
    if info.unavailable_reason is None:
        pytest.skip("usable here")
    error = shim.capabilities(ABI.CONV_FORWARD, F.DTYPES["float32"])
    assert isinstance(error, tuple) and error[0] == "UNAVAILABLE", error
    assert info.unavailable_reason.decode() in error[1]


ALL_DTYPES = dict(F.DTYPES, int32=(ABI.DTYPE_INT, 32), float8=(ABI.DTYPE_FLOAT, 8))


@SHIMS
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
    assert caps.spatial_ranks and caps.spatial_ranks & ~0b1110 == 0
    assert caps.activations & (1 << ABI.ACTIVATION_NONE)
    assert caps.activations >> ABI.NUM_ACTIVATIONS == 0
    if OPS[op] != ABI.CONV_FORWARD:
        assert caps.activations == 1 << ABI.ACTIVATION_NONE
    assert caps.features & ~sum(FEATURES.values()) == 0
    if caps.features & ABI.FEATURE_PACK_WEIGHTS:
        assert shim.api.Conv_Plan_Pack_Weights and OPS[op] == ABI.CONV_FORWARD
    if caps.features & ABI.FEATURE_BIAS_GRADIENT:
        assert OPS[op] == ABI.CONV_BACKWARD_WEIGHT  # the feature of that op alone


@SHIMS
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


@SHIMS
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


@SHIMS
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


@SHIMS
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


@SHIMS
@pytest.mark.parametrize("op", sorted(OPS))
def test_pack_weights_as_reported(shim, op):
    caps = served(shim, OPS[op], "float32")
    p = Problem(shim, op=op)
    handle, size = plan(shim, p)
    try:
        if not shim.api.Conv_Plan_Pack_Weights:
            assert not caps.features & ABI.FEATURE_PACK_WEIGHTS
            return
        pack = F.new(F.ConvPlanPackWeightsArgs, plan=handle, w=p.arrays["w"].ctypes.data)
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
            np.testing.assert_allclose(p.result(), p.expected(), rtol=1e-5, atol=1e-5)
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
    "op_3": (_set("op", 3), "op 3"),
    "op_negative": (_set("op", -1), "op -1"),
    "activation_9": (_set("activation", 9), "activation 9"),
    "activation_huge": (_set("activation", 1 << 30), f"activation {1 << 30}"),
    "algo_policy_3": (_set("algo_policy", 3), "algo_policy 3"),
    "spatial_rank_4": (_set("spatial_rank", 4), "spatial_rank 4"),
    "x_null": (_null_field("x"), "x is NULL"),
    "w_null": (_null_field("w"), "w is NULL"),
    "y_null": (_null_field("y"), "y is NULL"),
    "bias_null": (_null_field("bias"), "bias is NULL"),
    "x_shape_null": (_null_array("x", "shape"), "NULL shape"),
    "w_strides_null": (_null_array("w", "strides"), "NULL strides"),
    "bias_shape_null": (_null_array("bias", "shape"), "NULL shape"),
    "stride_0": (_set("stride", 0, 1), "stride[1] is 0"),
    "stride_negative": (_set("stride", -2, 0), "stride[0] is -2"),
    "dilation_0": (_set("dilation", 0, 0), "dilation[0] is 0"),
    "padding_lo_negative": (_set("padding_lo", -1, 1), "padding_lo[1] is -1"),
    "padding_hi_negative": (_set("padding_hi", -3, 0), "padding_hi[0] is -3"),
    "groups_0": (_set("groups", 0), "groups is 0"),
    "x_misaligned": (_misalign("x"), "not aligned"),
    "y_misaligned": (_misalign("y"), "not aligned"),
    "activation_on_backward": (_set("op", 1), "forward only"),
}


@SHIMS
@pytest.mark.parametrize("case", sorted(RULES))
def test_invalid_arguments_are_refused_naming_the_field(shim, case):
    usable(shim)
    p = Problem(shim, bias=True, activation="relu" if case == "activation_on_backward" else "none")
    if case == "activation_on_backward":
        p.args.bias = C.pointer(F.DLTensor(ndim=0))
    change, words = RULES[case]
    change(p)
    p.args.plan, p.args.workspace_size, p.args.chosen_algo_id = 12345, 777, -5
    error = shim.call("Conv_Plan_Create", p.args)
    assert error is not None and error[0] == "INVALID_ARGUMENT", error
    assert words in error[1], error
    assert (p.args.plan, p.args.workspace_size, p.args.chosen_algo_id) == (12345, 777, -5)


@SHIMS
def test_stride_zero_on_every_dim_is_refused_before_any_division(shim):
    """The output size divides by the stride: a shim must refuse stride 0 first (a SIGFPE
    here ends the test process)."""
    usable(shim)
    for rank in (1, 2, 3):
        p = Problem(shim, rank=rank)
        for i in range(rank):
            p.args.stride[i] = 0
        error = shim.call("Conv_Plan_Create", p.args)
        assert error is not None and error[0] == "INVALID_ARGUMENT" and "stride[0] is 0" in error[1], error


# ---------------------------------------------------------------------------------------------
# Execute


@SHIMS
@pytest.mark.parametrize("pointer", ["x", "w", "y", "bias"])
def test_execute_refuses_a_pointer_not_aligned_to_the_element(shim, pointer):
    on_cpu(shim)
    p = Problem(shim, bias=True)
    handle, size = plan(shim, p)
    try:
        error = shim.call("Conv_Plan_Execute", p.execute_args(handle, size, **{pointer: p.arrays[pointer].ctypes.data + 1}))
        assert error is not None and error[0] == "INVALID_ARGUMENT", error
        assert pointer in error[1] and "aligned" in error[1], error
        assert np.isnan(p.arrays["y"]).all()  # nothing written
    finally:
        shim.destroy(handle)


@SHIMS
def test_one_plan_executes_on_several_threads_at_once(shim):
    on_cpu(shim)
    problems = [Problem(shim, bias=True, seed=1) for _ in range(4)]
    handle, size = plan(shim, problems[0])
    errors = []
    start = threading.Barrier(len(problems))

    def work(p):
        start.wait()
        for _ in range(5):
            errors.append(shim.call("Conv_Plan_Execute", p.execute_args(handle, size)))

    threads = [threading.Thread(target=work, args=(p,)) for p in problems]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shim.destroy(handle)
    assert errors == [None] * 20
    for p in problems:
        np.testing.assert_allclose(p.result(), p.expected(), rtol=1e-5, atol=1e-5)

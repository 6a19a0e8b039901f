"""The onednn_sycl shim on a real SYCL device (issue 28): every op, dtype, rank and option
against the float64 reference, on USM memory of dpctl arrays, work on dpctl's own queue.

Here the device is the CPU through Intel's OpenCL CPU runtime (intel-opencl-rt, pinned set of
scripts/sycl_env.sh); an Intel GPU runs the same tests (scripts/xpu_check.sh). Skipped, with
the reason, where the shim, dpctl, the SYCL runtime or a device is missing.

The shim library: FLUX_DNN_ONEDNN_SYCL_SHIM, else the installed flux-dnn-sycl's. Each case
draws fresh random inputs, poisons the output with NaN (beta = 0) and compares the whole
output (and a bias gradient) with tests/reference.py in float64."""

from __future__ import annotations

import ctypes as C
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reference as ref

try:  # the plug-in's preload: OCL_ICD_FILENAMES and the libraries, before dpctl lists devices
    import flux_dnn_sycl
except ImportError:
    flux_dnn_sycl = None

dpctl = pytest.importorskip("dpctl", reason="dpctl (the SYCL array library) is not installed")
dpt = pytest.importorskip("dpctl.tensor")

from abi import fdnn_ctypes as F  # noqa: E402
from abi.fdnn_ctypes import ABI  # noqa: E402


def _library() -> str | None:
    env = os.environ.get("FLUX_DNN_ONEDNN_SYCL_SHIM")
    if env:
        return env
    if flux_dnn_sycl is not None:
        return str(flux_dnn_sycl.LIBRARY)
    return None


LIBRARY = _library()
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
STORAGE = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
OPS = {
    "forward": ABI.CONV_FORWARD,
    "backward_data": ABI.CONV_BACKWARD_DATA,
    "backward_weight": ABI.CONV_BACKWARD_WEIGHT,
}
ACTS = {name.lower(): value for name, value in ABI.group("ACTIVATION_").items()}
# The shim's algorithms (layout policies), by id.
LAYOUTS = ["user layouts", "vendor layouts", "vendor weights", "blocked 16c layouts"]


@pytest.fixture(scope="module")
def shim():
    if LIBRARY is None or not os.path.exists(LIBRARY):
        pytest.skip(f"no onednn_sycl shim library here ({LIBRARY}): pip install flux-dnn-sycl")
    if flux_dnn_sycl is not None:
        flux_dnn_sycl.preload()
    s = F.Shim(LIBRARY)
    reason = s.reason()
    if reason is not None:
        pytest.skip(f"onednn_sycl cannot run here: {reason}")
    return s


@pytest.fixture(scope="module")
def queue(shim):
    # An in-order queue, as torch XPU's; test_out_of_order_queue covers dpctl's default kind.
    return dpctl.SyclQueue(dpctl.select_default_device(), property="in_order")


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "bfloat16":
        return np.asarray(values).astype(STORAGE[dtype])
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def exact(rng, shape):
    """Quarters in [-1, 1]: exact in every dtype, so 16-bit results differ by roundings only."""
    return rng.integers(-4, 5, size=shape) / 4.0


class Case:
    """One problem: NumPy values, dpctl arrays on `queue`, descriptors, plan args."""

    def __init__(
        self,
        queue,
        *,
        op="forward",
        dtype="float32",
        rank=2,
        groups=1,
        dilation=1,
        stride=1,
        lo=1,
        hi=1,
        bias=False,
        alpha=1.0,
        beta=0.0,
        activation="none",
        act=(0.0, 0.0),
        channels_last=False,
        policy=0,
        algo=0,
        seed=0,
        sizes=None,
    ):
        rng = np.random.default_rng(seed)
        self.queue, self.op, self.dtype, self.rank = queue, OPS[op], dtype, rank
        C_, K = 2 * groups, 3 * groups
        sp = (sizes or (7, 6, 5))[:rank]
        ks = (3, 2, 3)[:rank]
        self.geo = dict(
            stride=(stride,) * rank, dilation=(dilation,) * rank, lo=(lo,) * rank, hi=(hi,) * rank, groups=groups
        )
        osp = tuple(ref.out_size(sp[i], ks[i], stride, dilation, lo, hi) for i in range(rank))
        shapes = {"x": (2, C_, *sp), "w": (K, C_ // groups, *ks), "y": (2, K, *osp), "bias": (K,)}
        self.values = {n: exact(rng, s) for n, s in shapes.items() if n != "bias" or bias}
        self.out = {OPS["forward"]: "y", OPS["backward_data"]: "x", OPS["backward_weight"]: "w"}[self.op]
        self.writes_bias = bias and self.op == OPS["backward_weight"]
        self.alpha, self.beta, self.activation, self.act = alpha, beta, activation, act
        self.host, self.dev = {}, {}
        for name, v in self.values.items():
            h = to_bits(v, dtype)
            if beta == 0 and (name == self.out or (name == "bias" and self.writes_bias)):
                h = to_bits(np.full(v.shape, np.nan), dtype)  # poison: an unwritten element shows
            if channels_last and h.ndim > 2:
                h = np.moveaxis(np.moveaxis(h, 1, -1).copy(), -1, 1)  # NHWC strides, logical NCHW
            self.host[name] = h
            self.dev[name] = dpt.asarray(h, sycl_queue=queue)
        self.keep = []
        code, bits = F.DTYPES[dtype]
        desc = {n: self._descriptor(self.dev.get(n), (code, bits)) for n in ("x", "w", "y", "bias")}
        self.args = F.new(
            F.ConvPlanCreateArgs,
            op=self.op,
            spatial_rank=rank,
            groups=groups,
            alpha=alpha,
            beta=beta,
            activation=ACTS[activation],
            activation_alpha=act[0],
            activation_beta=act[1],
            algo_policy=policy,
            algo_id=algo,
            workspace_limit=C.c_size_t(-1).value,
            stream=queue.addressof_ref(),
            **{n: C.pointer(d) for n, d in desc.items()},
        )
        for i in range(rank):
            self.args.stride[i], self.args.dilation[i] = stride, dilation
            self.args.padding_lo[i], self.args.padding_hi[i] = lo, hi
        self.desc = desc

    def _descriptor(self, a, dtype):
        if a is None:
            return F.DLTensor(ndim=0)
        shape = (C.c_int64 * a.ndim)(*a.shape)
        strides = (C.c_int64 * a.ndim)(*a.strides)  # dpctl strides are in elements
        self.keep += [shape, strides]
        return F.DLTensor(
            data=a.usm_data._pointer,
            device=F.DLDevice(ABI.DEVICE_ONEAPI, 0),
            ndim=a.ndim,
            dtype=F.DLDataType(dtype[0], dtype[1], 1),
            shape=shape,
            strides=strides,
        )

    def pointer(self, name):
        a = self.dev.get(name)
        return None if a is None else a.usm_data._pointer

    def run(self, shim, queue=None, workspace_extra=0):
        err = shim.call("Conv_Plan_Create", self.args)
        assert err is None, err
        plan, size = self.args.plan, self.args.workspace_size
        self.algo_name = self.args.algo_name.decode()
        try:
            self.execute(shim, plan, size, queue)
        finally:
            shim.destroy(plan)

    def execute_args(self, plan, size, queue, w=True, stream=True):
        """Conv_Plan_Execute's args for this case's arrays, a fresh device workspace of `size`
        bytes (returned too: it must outlive the call) and `queue` as the stream (None with
        stream=False)."""
        ws = dpctl.memory.MemoryUSMDevice(max(size, 64), queue=queue) if size else None
        args = F.new(
            F.ConvPlanExecuteArgs,
            plan=plan,
            x=self.pointer("x"),
            w=self.pointer("w") if w else None,
            y=self.pointer("y"),
            bias=self.pointer("bias"),
            workspace=ws._pointer if ws else None,
            workspace_size=size,
            stream=queue.addressof_ref() if stream else None,
        )
        return args, ws

    def execute(self, shim, plan, size, queue=None, w=True):
        q = queue or self.queue
        args, ws = self.execute_args(plan, size, q, w=w)
        err = shim.call("Conv_Plan_Execute", args)
        assert err is None, err
        q.wait()

    def expected(self):
        v, g = self.values, dict(self.geo)
        if self.op == OPS["forward"]:
            r = ref.conv_forward(v["x"], v["w"], v.get("bias"), **g)
            r = self.alpha * activation_ref(r, self.activation, *self.act)
        elif self.op == OPS["backward_data"]:
            r = self.alpha * ref.conv_backward_data(v["y"], v["w"], v["x"].shape, **g)
        else:
            r = self.alpha * ref.conv_backward_weight(v["x"], v["y"], v["w"].shape, **g)
        return r + self.beta * v[self.out] if self.beta else r

    def result(self, name):
        return from_bits(dpt.asnumpy(self.dev[name]), self.dtype)

    def check(self):
        """The max error against the reference, relative to the largest magnitude; asserts
        within the dtype's tolerance and no NaN."""
        checks = [(self.out, self.expected())]
        if self.writes_bias:
            axes = (0, *range(2, self.rank + 2))
            db = self.alpha * self.values["y"].sum(axis=axes)
            checks.append(("bias", db + self.beta * self.values["bias"] if self.beta else db))
        worst = 0.0
        for name, want in checks:
            got = self.result(name)
            assert not np.isnan(got).any(), f"{name}: unwritten (NaN) elements"
            scale = max(1.0, float(np.abs(want).max()))
            err = float(np.abs(got - want).max()) / scale
            assert err <= TOLERANCE[self.dtype] * 4, f"{name}: max error {err:g} (scaled) > {TOLERANCE[self.dtype]}"
            worst = max(worst, err)
        ERRORS[self.dtype] = max(ERRORS.get(self.dtype, 0.0), worst)
        return worst


ERRORS: dict = {}


def activation_ref(v, name, a, b):
    import math

    return {
        "none": lambda: v,
        "relu": lambda: np.maximum(v, 0),
        "leaky_relu": lambda: np.where(v >= 0, v, a * v),
        "clip": lambda: np.clip(v, a, b),
        "sigmoid": lambda: 1 / (1 + np.exp(-v)),
        "tanh": lambda: np.tanh(v),
        "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "gelu_erf": lambda: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
        "silu": lambda: v / (1 + np.exp(-v)),
    }[name]()


def served(shim, op, dtype):
    caps = shim.capabilities(OPS[op], F.DTYPES[dtype])
    assert not isinstance(caps, tuple), caps
    if caps.support == ABI.SUPPORT_NONE:
        pytest.skip(f"{dtype} {op} not computed on this device: {caps.detail.decode()}")
    return caps


# ------------------------------------------------------------------------------------------
# The device and the runtime


def test_shim_reports_the_sycl_device(shim):
    info = shim.info()
    assert info.shim_name == b"onednn_sycl" and info.device_type == ABI.DEVICE_ONEAPI
    assert info.num_devices == len(dpctl.get_devices()) >= 1
    assert info.vendor_version_runtime.decode().startswith("3.")
    d = F.new(F.DeviceDescribeArgs, device_id=0)
    assert shim.call("Device_Describe", d) is None
    assert dpctl.get_devices()[0].name in d.name.decode()


def test_cpu_device_visible_without_settings(shim):
    """A fresh interpreter with no OCL_ICD_FILENAMES that imports dpctl alone (not flux_dnn)
    lists the OpenCL CPU device exactly once: the plug-in's start-up hook (flux_dnn_sycl.pth)
    set the variable; the wheel's .icd file alone names a placeholder path."""
    if not any(d.backend.name == "opencl" and d.is_cpu for d in dpctl.get_devices()):
        pytest.skip("no OpenCL CPU device in this process either")
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_FILENAMES"}
    code = "import dpctl; print(sum(d.backend.name == 'opencl' and d.is_cpu for d in dpctl.get_devices()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1", r.stdout + r.stderr


def test_queue_device_read_through_libsycl_abi(shim, queue):
    """The shim reads a queue's device and context through libsycl's exported member functions
    with a layout-compatible sycl::device (one shared_ptr): the engine it makes for dpctl's
    queue must be the one of dpctl's device (a plan on it runs: the other tests), and a plan
    made with no stream (device_id's device, its platform's default context) runs on dpctl's
    default-context queue too (same engine, no rebuild)."""
    case = Case(queue, seed=11)
    case.args.stream = None
    case.run(shim)
    case.check()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_capabilities_per_dtype(shim, dtype):
    for op in OPS:
        caps = shim.capabilities(OPS[op], F.DTYPES[dtype])
        assert not isinstance(caps, tuple), caps
        if caps.support != ABI.SUPPORT_NONE:
            assert caps.features & ABI.FEATURE_GROUPS and caps.features & ABI.FEATURE_ALPHA_BETA
    assert shim.capabilities(OPS["forward"], F.DTYPES["float32"]).support == ABI.SUPPORT_NATIVE


# ------------------------------------------------------------------------------------------
# Numbers: every op x dtype x rank x option set

OPTION_SETS = {
    "plain": dict(),
    "strided_grouped_dilated_asym": dict(stride=2, groups=2, dilation=2, lo=2, hi=0),
    "alpha_beta": dict(alpha=0.5, beta=0.75),
    "channels_last_bias": dict(channels_last=True, bias=True),
    "vendor_layouts": dict(policy=2, algo=1, bias=True, lo=0, hi=2),
}


@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", list(OPS))
def test_matches_float64_reference(shim, queue, op, dtype, rank, options):
    served(shim, op, dtype)
    opts = dict(OPTION_SETS[options])
    if opts.get("bias") and op == "backward_data":
        opts["bias"] = False  # no bias on backward-data (the header)
    seed = hash((op, dtype, rank, options)) % 2**32
    case = Case(queue, op=op, dtype=dtype, rank=rank, seed=seed, **opts)
    case.run(shim)
    case.check()


@pytest.mark.parametrize(
    "activation,act",
    [
        ("relu", (0, 0)),
        ("leaky_relu", (0.1, 0)),
        ("clip", (-0.5, 0.5)),
        ("sigmoid", (0, 0)),
        ("tanh", (0, 0)),
        ("gelu_tanh", (0, 0)),
        ("gelu_erf", (0, 0)),
        ("silu", (0, 0)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_activation_with_bias_alpha_beta(shim, queue, dtype, activation, act):
    served(shim, "forward", dtype)
    case = Case(queue, dtype=dtype, bias=True, activation=activation, act=act, alpha=0.5, beta=0.25, seed=7)
    case.run(shim)
    case.check()


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_transposed_convolution_is_backward_data(shim, queue, rank):
    """conv_transpose(x, w, stride 2) = backward-data of dy := x, checked against the same
    reference (tests/reference.py's conv_transpose) as the CPU shims."""
    case = Case(queue, op="backward_data", rank=rank, stride=2, lo=1, hi=0, seed=5 + rank)
    case.run(shim)
    case.check()


def test_benchmark_policy_times_on_the_callers_queue(shim, queue):
    case = Case(queue, policy=1, bias=True, seed=3)
    case.run(shim)
    case.check()
    assert any(f"({name})" in case.algo_name for name in LAYOUTS), case.algo_name


@pytest.mark.parametrize("algo", range(len(LAYOUTS)))
@pytest.mark.parametrize("op", list(OPS))
def test_every_algorithm_id(shim, queue, op, algo):
    """Each layout policy given by id, against float64, its name in the plan's; 16 groups
    (C=32, K=48: the blocked policy takes both activations in nChw16c)."""
    case = Case(queue, op=op, policy=2, algo=algo, groups=16, bias=op != "backward_data", seed=61 + algo)
    case.run(shim)
    case.check()
    assert f"({LAYOUTS[algo]})" in case.algo_name, case.algo_name


def test_packed_weights(shim, queue):
    case = Case(queue, bias=True, seed=4)
    assert shim.call("Conv_Plan_Create", case.args) is None
    plan = case.args.plan
    pack = F.new(F.ConvPlanPackWeightsArgs, plan=plan, w=case.pointer("w"), stream=queue.addressof_ref())
    assert shim.call("Conv_Plan_Pack_Weights", pack) is None
    shim.destroy(plan)
    # The caller's weights change afterwards: the packed plan must not see it.
    dpt.asarray(np.zeros(case.host["w"].shape, case.host["w"].dtype), sycl_queue=queue)
    case.dev["w"][...] = 0
    case.execute(shim, pack.packed_plan, pack.workspace_size, w=False)
    shim.destroy(pack.packed_plan)
    case.check()


@pytest.mark.parametrize("op", list(OPS))
def test_out_of_order_queue(shim, op):
    """dpctl's default queues are out of order: the shim orders its work after the queue's
    earlier work (a barrier) and its own primitives after each other (oneDNN does not on such
    a queue: staging reorders, then the convolution after all of them, then the output
    reorder, ordered by events),
    and the read is ordered after the call by a barrier's event in dpctl's order manager, as
    the providers do (no host wait). Vendor layouts and alpha/beta: several primitives."""
    q = dpctl.SyclQueue(dpctl.select_default_device())
    assert not q.is_in_order
    for seed in range(3):
        case = Case(
            q,
            op=op,
            rank=3,
            bias=op != "backward_data",
            seed=9 + seed,
            sizes=(12, 12, 12),
            policy=2,
            algo=1,
            alpha=0.5,
            beta=0.25,
        )
        err = shim.call("Conv_Plan_Create", case.args)
        assert err is None, err
        args, ws = case.execute_args(case.args.plan, case.args.workspace_size, q)
        assert shim.call("Conv_Plan_Execute", args) is None
        shim.destroy(case.args.plan)  # with its work in flight: oneDNN holds the primitives
        from dpctl.utils import SequentialOrderManager

        done = q.submit_barrier()
        SequentialOrderManager[q].add_event_pair(done, done)
        case.check()  # no q.wait() before reading


@pytest.mark.parametrize("op", list(OPS))
def test_out_of_order_input_branches_ordered(shim, no_blocking, op):
    """On an out-of-order queue the shim submits each input's staging (its gathers, then its
    reorder) as a branch after the leading barrier and the convolution after every branch.
    Each call here reads inputs that dpctl kernels wrote just before it (no host wait), into an
    output and a workspace poisoned with NaN just before it, and is read once after a barrier in
    dpctl's order manager: a branch not ordered after those kernels reads stale or NaN inputs,
    a convolution not ordered after every branch reads NaN staging buffers. Vendor layouts
    stage x, w and y; on forward the bias is a broadcast (stride 0: gathered, then staged).
    On the OpenCL CPU device two deliberately broken shims passed it too (branches with no
    dependency on the leading barrier; the convolution after the last branch only): this
    runtime ran the host tasks after the barrier and one at a time in submission order there,
    so this is a check of the results, which a device that overlaps the branches sharpens."""
    from dpctl.utils import SequentialOrderManager

    q = dpctl.SyclQueue(dpctl.select_default_device())
    assert not q.is_in_order
    case = Case(q, op=op, rank=2, groups=4, sizes=(48, 48), bias=op != "backward_data", policy=2, algo=1, seed=61)
    reads = [n for n in ("x", "w", "y") if n != case.out] + (["bias"] if op == "forward" else [])
    if op == "forward":
        case.desc["bias"].strides[0] = 0
    assert shim.call("Conv_Plan_Create", case.args) is None
    try:
        args, ws = case.execute_args(case.args.plan, case.args.workspace_size, q)
        assert case.args.workspace_size >= 4
        ws_floats = dpt.usm_ndarray((case.args.workspace_size // 4,), dtype="f4", buffer=ws)
        rng = np.random.default_rng(62)
        R = 256
        for _ in range(4):
            fresh = {}
            for name in reads:
                v = exact(rng, case.values[name].shape)
                if name == "bias":
                    v = np.full(v.shape, v[0])
                # R copies of v / R: their sum (a slow kernel) is v exactly
                parts = np.repeat((v / R)[..., None], R, axis=-1)
                fresh[name] = dpt.asarray(to_bits(parts, "float32"), sycl_queue=q)
                case.values[name] = v
            q.wait()  # the uploads done: what follows runs with no host wait
            for name in reads:  # dpctl kernels write the inputs in place just before the call
                dpt.sum(fresh[name], axis=-1, out=case.dev[name])
            case.dev[case.out][...] = np.nan
            if case.writes_bias:
                case.dev["bias"][...] = np.nan
            ws_floats[...] = np.nan
            assert shim.call("Conv_Plan_Execute", args) is None
            done = q.submit_barrier()
            SequentialOrderManager[q].add_event_pair(done, done)
            case.check()  # read after the barrier, with no q.wait()
    finally:
        shim.destroy(case.args.plan)


def test_workspace_from_the_caller_is_used(shim, queue):
    """Vendor layouts stage operands in the workspace: the plan reports it and runs in it."""
    case = Case(queue, policy=2, algo=1, rank=2, sizes=(16, 16), seed=12)
    case.run(shim)
    assert case.args.workspace_size > 0
    case.check()


def test_stream_null_at_execute_is_refused(shim, queue):
    case = Case(queue, seed=1)
    assert shim.call("Conv_Plan_Create", case.args) is None
    args, ws = case.execute_args(case.args.plan, case.args.workspace_size, queue, stream=False)
    err = shim.call("Conv_Plan_Execute", args)
    shim.destroy(case.args.plan)
    assert err is not None and err[0] == "INVALID_ARGUMENT" and "queue" in err[1], err


@pytest.mark.parametrize("algo", [0, 1])
@pytest.mark.parametrize("op", list(OPS))
def test_overlapping_read_tensors_are_gathered(shim, queue, op, algo):
    """A broadcast (stride 0) and a sliding window (stride 1 on C, as W): valid by the header,
    refused by oneDNN's descriptors, gathered by the shim slice by slice into the workspace."""
    read = {"forward": "x", "backward_data": "y", "backward_weight": "x"}[op]
    case = Case(queue, op=op, policy=2, algo=algo, bias=op == "forward", seed=21)
    a = case.dev[read]
    window = dpt.asarray(exact(np.random.default_rng(5), (a.size,)), dtype=a.dtype, sycl_queue=queue)
    # C (dim 1) steps 1 element, as the last dim does: neighbouring channels share elements.
    strides = list(a.strides)
    strides[1] = 1
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    host = dpt.asnumpy(window)[:span]
    case.values[read] = np.lib.stride_tricks.as_strided(
        host.astype(np.float64), a.shape, [s * 8 for s in strides]
    ).copy()
    case.dev[read] = window
    case.desc[read].data = window.usm_data._pointer
    case.desc[read].strides[1] = 1
    if op == "forward":  # and a broadcast bias: one value, stride 0
        b = case.dev["bias"]
        case.values["bias"] = np.full(b.shape, case.values["bias"][0])
        case.desc["bias"].strides[0] = 0
    case.run(shim)
    case.check()


# ------------------------------------------------------------------------------------------
# Ordering without host waits (issue 28, deliverable 4): Conv_Plan_Execute returns once its work
# is queued. On an in-order queue the queue orders it. On an out-of-order queue (dpnp's default)
# the shim orders its primitives with events after a queue barrier (the queue's earlier work)
# and ends with a barrier waiting for all of them: later work is ordered after the call by depending on
# a barrier submitted after it (dpctl's SyclQueue.submit_barrier(); the plug-in's providers add
# its event to dpctl's order manager, which dpnp's operations depend on). Each chain below is
# submitted with no host wait in between and read once at the end, into outputs poisoned with
# NaN.


@pytest.fixture
def no_blocking(monkeypatch):
    """The asynchronous path: FLUX_DNN_SYCL_BLOCKING (set by the USM memory of the ABI suite
    when it runs in this process) unset."""
    monkeypatch.delenv("FLUX_DNN_SYCL_BLOCKING", raising=False)


QUEUES = {"in_order": {"property": "in_order"}, "out_of_order": {}}


@pytest.mark.parametrize("kind", list(QUEUES))
def test_dependent_shim_calls_without_host_wait(shim, no_blocking, kind):
    """forward x -> y, then backward-data y -> dx (vendor layouts, alpha: several primitives
    each, staged in one workspace reused by both), a dpctl kernel writing x before and one
    reading dx after (on the out-of-order queue through a barrier's event in dpctl's order
    manager: what a caller of the ABI does there), no host wait: dx is right, nothing NaN."""
    q = dpctl.SyclQueue(dpctl.select_default_device(), **QUEUES[kind])
    assert q.is_in_order == (kind == "in_order")
    fwd = Case(q, rank=2, sizes=(40, 40), seed=31, policy=2, algo=1, alpha=0.5)
    bwd = Case(q, op="backward_data", rank=2, sizes=(40, 40), seed=32, policy=2, algo=1, beta=0.0)
    plans = []
    for case in (fwd, bwd):
        assert shim.call("Conv_Plan_Create", case.args) is None
        plans.append((case.args.plan, case.args.workspace_size))
    size = max(s for _, s in plans)
    ws = dpctl.memory.MemoryUSMDevice(max(size, 64), queue=q)

    def execute(plan, x, w, y):
        args = F.new(
            F.ConvPlanExecuteArgs,
            plan=plan,
            x=x.usm_data._pointer,
            w=w.usm_data._pointer,
            y=y.usm_data._pointer,
            workspace=ws._pointer,
            workspace_size=size,
            stream=q.addressof_ref(),
        )
        assert shim.call("Conv_Plan_Execute", args) is None

    try:
        x = fwd.dev["x"] * 2  # a dpctl kernel writes the input just before the first call
        execute(plans[0][0], x, fwd.dev["w"], fwd.dev["y"])  # y = 0.5 * conv(2x, w)
        # bwd's dy is fwd's output (same shape), its dx a poisoned array: dx = conv_bwd(y, w2)
        execute(plans[1][0], bwd.dev["x"], bwd.dev["w"], fwd.dev["y"])
        if not q.is_in_order:
            from dpctl.utils import SequentialOrderManager

            done = q.submit_barrier()
            SequentialOrderManager[q].add_event_pair(done, done)
        doubled = bwd.dev["x"] * 2  # a dpctl kernel reads the result after the second call
        got = dpt.asnumpy(doubled)
    finally:
        for plan, _ in plans:
            shim.destroy(plan)
    y = 0.5 * ref.conv_forward(2 * fwd.values["x"], fwd.values["w"], None, **fwd.geo)
    want = 2 * ref.conv_backward_data(y, bwd.values["w"], bwd.values["x"].shape, **bwd.geo)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


_CHAIN = textwrap.dedent(
    """
    import os, sys, numpy as np
    sys.path[:0] = {paths!r}
    os.environ.pop("FLUX_DNN_SYCL_BLOCKING", None)
    import dpctl, dpnp, flux_dnn, reference as ref
    for kind in ("in_order", "out_of_order"):
        props = {{"property": "in_order"}} if kind == "in_order" else {{}}
        q = dpctl.SyclQueue(dpctl.select_default_device(), **props)
        assert q.is_in_order == (kind == "in_order")
        rng = np.random.default_rng(41)
        x = rng.standard_normal((2, 8, 48, 48)).astype(np.float32)
        ws = [rng.standard_normal((8, 8, 3, 3)).astype(np.float32) / 8 for _ in range(3)]
        wd = [dpnp.asarray(w, sycl_queue=q) for w in ws]
        def poisoned():
            return dpnp.full((2, 8, 48, 48), np.nan, dtype=np.float32, sycl_queue=q)
        for rep in range(3):
            h = flux_dnn.conv2d(dpnp.asarray(x, sycl_queue=q), wd[0], padding=1, out=poisoned())
            h = flux_dnn.conv2d(h * 2 + 1, wd[1], padding=1, out=poisoned())  # a temporary input
            junk = [dpnp.full(x.shape, 7.0, dtype=np.float32, sycl_queue=q) for _ in range(4)]
            h = flux_dnn.conv2d(dpnp.where(h > 0, h, 0.5 * h), wd[2], padding=1, out=poisoned())
            got = dpnp.asnumpy(h - 1)
            del junk
            r = ref.conv_forward(x.astype(np.float64), ws[0], None, (1, 1), (1, 1), (1, 1))
            r = ref.conv_forward(r * 2 + 1, ws[1], None, (1, 1), (1, 1), (1, 1))
            want = ref.conv_forward(np.where(r > 0, r, 0.5 * r), ws[2], None, (1, 1), (1, 1), (1, 1)) - 1
            assert not np.isnan(got).any(), kind
            err = float(np.abs(got - want).max() / np.abs(want).max())
            print(kind, rep, err)
            assert err < 1e-4, (kind, err)
    print("chain ok")
    """
)


def test_chain_of_flux_dnn_calls_without_host_wait(shim):
    """Through flux_dnn on dpnp arrays, an in-order and an out-of-order queue: three dependent
    convolutions with dpnp kernels between them, outputs poisoned (out=), inputs made by dpnp
    just before and dropped right after the call (their memory is kept until the work has run:
    the provider's keeper) while new arrays take freed memory, no wait until the final read,
    three times; against float64. In a fresh interpreter, as the test below: a pytest process
    that imports dpnp beside this module's ctypes-loaded shim crashes at exit in the SYCL
    runtime's teardown (__sycl_unregister_lib from dpnp's module; measured with the shim of the
    commit before this change too), so dpnp is not imported here."""
    if flux_dnn_sycl is None:
        pytest.skip("flux_dnn_sycl is not installed")
    import importlib.util

    if importlib.util.find_spec("dpnp") is None:
        pytest.skip("dpnp is not installed")
    here = pathlib.Path(__file__).resolve().parent
    code = _CHAIN.format(paths=[str(here), str(here / "abi")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here, timeout=300)
    assert r.returncode == 0 and "chain ok" in r.stdout, r.stdout + r.stderr


_MANY_QUEUES = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path[:0] = {paths!r}
    import dpctl, dpnp, flux_dnn, reference as ref
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    want = ref.conv_forward(x.astype(np.float64), w, None, (1, 1), (1, 1), (1, 1))
    outs = []
    for i in range(300):  # more queues than the shim keeps streams for (256)
        q = dpctl.SyclQueue(dpctl.select_default_device(), **({{"property": "in_order"}} if i % 2 else {{}}))
        outs.append(flux_dnn.conv2d(dpnp.asarray(x, sycl_queue=q), dpnp.asarray(w, sycl_queue=q), padding=1))
    err = max(float(np.abs(dpnp.asnumpy(y) - want).max()) for y in outs)
    print("many queues", err)
    assert err < 1e-4, err
    """
)


def test_more_queues_than_kept_streams(shim):
    """The shim keeps a oneDNN stream per queue for 256 queues; a call on a queue beyond them
    gets a stream of its own and waits for its work before destroying it: 300 queues, in
    order and out of order, each result right. In a fresh interpreter (the stream cache is
    the process's)."""
    if flux_dnn_sycl is None:
        pytest.skip("flux_dnn_sycl is not installed")
    here = pathlib.Path(__file__).resolve().parent
    code = _MANY_QUEUES.format(paths=[str(here), str(here / "abi")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here, timeout=300)
    assert r.returncode == 0 and "many queues" in r.stdout, r.stdout + r.stderr


def test_blocking_switch_waits(shim, monkeypatch):
    """FLUX_DNN_SYCL_BLOCKING=1: the result is there when Conv_Plan_Execute returns, read on
    the host from USM shared memory with no queue wait (what the ABI suite relies on)."""
    monkeypatch.setenv("FLUX_DNN_SYCL_BLOCKING", "1")
    q = dpctl.SyclQueue(dpctl.select_default_device())
    case = Case(q, rank=2, sizes=(24, 24), seed=51, policy=2, algo=1)
    shared = {}
    for name, a in case.dev.items():
        s = dpt.usm_ndarray(a.shape, dtype=a.dtype, buffer="shared", buffer_ctor_kwargs={"queue": q})
        s[...] = a
        shared[name] = s
    q.wait()
    case.dev = shared
    for name, d in case.desc.items():
        if name in shared:
            d.data = shared[name].usm_data._pointer
    assert shim.call("Conv_Plan_Create", case.args) is None
    args, ws = case.execute_args(case.args.plan, case.args.workspace_size, q)
    try:
        assert shim.call("Conv_Plan_Execute", args) is None
        y = np.frombuffer(shared["y"].usm_data, dtype=np.float32).reshape(shared["y"].shape).astype(np.float64)
    finally:
        shim.destroy(case.args.plan)
    want = case.expected()
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


# ------------------------------------------------------------------------------------------
# Two oneDNNs in one process (sycl_lib.hpp): the CPU shim's 3.2 and the SYCL shim's 3.9 have
# one soname, libdnnl.so.3. Each order in a fresh interpreter, results against float64.

_BOTH = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path[:0] = {paths!r}
    import flux_dnn, reference as ref
    order = {order!r}
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)
    want = ref.conv_forward(x, w, lo=(1, 1), hi=(1, 1))
    def version(name):
        return [s.vendor_version_runtime for s in flux_dnn.shims() if s.name == name]
    def cpu():
        err = np.abs(flux_dnn.conv2d(x, w, padding=1) - want).max()
        print("cpu", err, "oneDNN", version("onednn"))
        assert err < 1e-4, err
    def sycl():
        import dpnp
        y = flux_dnn.conv2d(dpnp.asarray(x), dpnp.asarray(w), padding=1)
        err = np.abs(dpnp.asnumpy(y) - want).max()
        print("sycl", err, "oneDNN", version("onednn_sycl"))
        assert err < 1e-4, err
    for step in order:
        {{"cpu": cpu, "sycl": sycl}}[step]()
    maps = open("/proc/self/maps").read()
    print("libdnnl files:", sorted({{l.split()[-1] for l in maps.splitlines() if "libdnnl" in l}}))
    """
)


@pytest.mark.parametrize("order", [("cpu", "sycl"), ("sycl", "cpu")], ids=["cpu_first", "sycl_first"])
def test_cpu_and_sycl_onednn_in_one_process(shim, order):
    """NumPy arrays (the CPU shim, oneDNN 3.2) and dpnp arrays (this shim, oneDNN 3.9) in one
    interpreter, in both orders, through flux_dnn (whose registry runs the CPU shims' preloads
    before any other shim loads): both right against float64, each on its own oneDNN, both
    files mapped. (A C caller that loads this shim before the CPU shim's oneDNN gives the CPU
    shim's by-name DT_NEEDED the SYCL oneDNN: glibc matches any loaded object by soname;
    measured, README.)"""
    pytest.importorskip("flux_dnn")
    if flux_dnn_sycl is None:
        pytest.skip("flux_dnn_sycl is not installed")
    import flux_dnn

    if not any(s.name == "onednn" and s.usable for s in flux_dnn.shims()):
        pytest.skip("the oneDNN CPU shim is not usable here")
    here = pathlib.Path(__file__).resolve().parent
    code = _BOTH.format(paths=[str(here), str(here / "abi")], order=list(order))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=here, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu" in r.stdout and "sycl" in r.stdout, r.stdout
    files = r.stdout.split("libdnnl files:")[-1]
    assert "libdnnl.so.3.9" in files, files
    # Each shim on its own oneDNN: the CPU shim's 3.2, not the SYCL wheel's 3.9 (which it gets
    # when <prefix>/lib/libdnnl.so.3, a file both wheels install, is the SYCL wheel's).
    assert "oneDNN ['3.2" in r.stdout.split("cpu ", 1)[1] and "oneDNN ['3.9" in r.stdout.split("sycl ", 1)[1], r.stdout


def test_report_max_errors():
    """Prints the largest scaled error per dtype seen by this module's cases (run last)."""
    print("onednn_sycl max scaled error vs float64:", {k: f"{v:.3g}" for k, v in sorted(ERRORS.items())})

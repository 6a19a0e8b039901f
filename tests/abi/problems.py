"""Small convolution problems for the ABI suite: NumPy operands, their descriptors and args
structs, poisoned outputs, and the float64 reference (tests/reference.py) to compare with."""

from __future__ import annotations

import ctypes as C
import math

import numpy as np

import reference as ref

from . import device_memory
from . import fdnn_ctypes as F
from .fdnn_ctypes import ABI

ACTIVATIONS = {name.lower(): value for name, value in ABI.group("ACTIVATION_").items()}
OPS = {
    "forward": ABI.CONV_FORWARD,
    "backward_data": ABI.CONV_BACKWARD_DATA,
    "backward_weight": ABI.CONV_BACKWARD_WEIGHT,
}
NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16}
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


class Problem:
    """One small convolution with NumPy arrays for every operand (data pointers at plan time
    on CPU shims; descriptors only elsewhere), NaN-poisoned output, and its reference."""

    def __init__(
        self,
        shim,
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
        act_a=0.0,
        act_b=0.0,
        flags=0,
        policy=0,
        seed=0,
    ):
        info = shim.info()
        # Whether the operands are host-visible and the problem executes: CPU shims, and a
        # device shim whose memory the host can reach (device_memory.py: USM shared memory
        # on a SYCL device), with that memory's stream.
        on_device = info.device_type != ABI.DEVICE_CPU and info.num_devices > 0
        self.memory = device_memory.for_device(info.device_type) if on_device else None
        self.cpu = info.device_type == ABI.DEVICE_CPU or self.memory is not None
        self.stream = self.memory.stream() if self.memory else None
        self.device = (info.device_type, 0)
        self.op, self.dtype, self.rank = OPS[op], dtype, rank
        rng = np.random.default_rng(seed)
        C_, K = 2 * groups, 3 * groups
        sp = (7, 6, 5)[:rank]
        ks = (3, 2, 3)[:rank]
        self.geo = dict(
            stride=(stride,) * rank, dilation=(dilation,) * rank, lo=(lo,) * rank, hi=(hi,) * rank, groups=groups
        )
        osp = tuple(ref.out_size(sp[i], ks[i], stride, dilation, lo, hi) for i in range(rank))
        # Quarters in [-1, 1]: exact in every dtype, so 16-bit results differ by one rounding.
        self.values = {
            name: rng.integers(-4, 5, size=shape) / 4.0
            for name, shape in (("x", (2, C_, *sp)), ("w", (K, C_ // groups, *ks)), ("y", (2, K, *osp)), ("bias", (K,)))
        }
        if not bias:
            del self.values["bias"]
        storage = NUMPY.get(dtype, np.uint16)
        self.arrays = {name: self._store(v, storage) for name, v in self.values.items()}
        if self.memory:
            self.arrays = {name: device_memory.copy(self.memory, a) for name, a in self.arrays.items()}
        self.out = {ABI.CONV_FORWARD: "y", ABI.CONV_BACKWARD_DATA: "x", ABI.CONV_BACKWARD_WEIGHT: "w"}[self.op]
        self.writes_bias = bias and self.op == ABI.CONV_BACKWARD_WEIGHT
        for name in (self.out, "bias") if beta == 0 else ():
            if name == self.out or self.writes_bias:
                self.arrays[name][...] = self._store(np.full(self.arrays[name].shape, np.nan), storage)
        code, bits = F.DTYPES[dtype]
        keep = []
        descriptors = {
            name: self._descriptor(self.arrays.get(name), (code, bits), keep) for name in ("x", "w", "y", "bias")
        }
        self.args = F.new(
            F.ConvPlanCreateArgs,
            op=self.op,
            spatial_rank=rank,
            groups=groups,
            alpha=alpha,
            beta=beta,
            activation=ACTIVATIONS[activation],
            activation_alpha=act_a,
            activation_beta=act_b,
            flags=flags,
            algo_policy=policy,
            workspace_limit=C.c_size_t(-1).value,
            stream=self.stream,
            **{name: C.pointer(d) for name, d in descriptors.items()},
        )
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
        return F.DLTensor(
            data=a.ctypes.data if self.cpu else None,
            device=F.DLDevice(*self.device),
            ndim=a.ndim,
            dtype=F.DLDataType(dtype[0], dtype[1], 1),
            shape=shape,
            strides=strides,
        )

    def execute_args(self, plan, workspace_size, **pointers):
        empty = self.memory.empty if self.memory else np.empty
        raw = empty((workspace_size + 64,), np.uint8)
        ws = raw.ctypes.data + (-raw.ctypes.data) % 64
        fields = {name: a.ctypes.data for name, a in self.arrays.items()}
        fields.update(pointers)
        args = F.new(
            F.ConvPlanExecuteArgs,
            plan=plan,
            workspace=ws if workspace_size else None,
            workspace_size=workspace_size,
            stream=self.stream,
            **fields,
        )
        args._keep = raw
        return args

    def expected(self):
        v = self.values
        g = dict(self.geo)
        if self.op == ABI.CONV_FORWARD:
            r = ref.conv_forward(v["x"], v["w"], v.get("bias"), **g)
            if self.activation != "none":
                r = _activation_ref(r, self.activation, *self.act)
            r = self.alpha * r  # the header's alpha * act(conv + bias)
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
    return {
        "relu": lambda: np.maximum(v, 0),
        "leaky_relu": lambda: np.where(v >= 0, v, a * v),
        "clip": lambda: np.clip(v, a, b),
        "sigmoid": lambda: 1 / (1 + np.exp(-v)),
        "tanh": lambda: np.tanh(v),
        "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "gelu_erf": lambda: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
        "silu": lambda: v / (1 + np.exp(-v)),
    }[name]()


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
    check_result(problem)


def check_result(problem):
    """The written tensor (and a bias gradient) against the float64 reference."""
    tol = TOLERANCE[problem.dtype]
    checks = [(problem.out, problem.expected())]
    if problem.writes_bias:
        checks.append(("bias", problem.bias_gradient_expected()))
    for name, expected in checks:
        np.testing.assert_allclose(
            problem.result(name), expected, rtol=tol, atol=tol * max(1.0, np.abs(expected).max()), err_msg=name
        )

"""A seeded fuzzer of the C ABI (csrc/include/flux_dnn/flux_dnn.h), driven through ctypes as a
C++ framework, Julia or Rust would drive a shim: no flux_dnn Python in between.

Each case is a small valid convolution (random op, rank, dtype, groups, stride, dilation,
padding, layout, bias, activation, alpha/beta, policy) with one or two fields mutated: NULL
pointers, struct_size, enum values, ranks, shapes, groups, strides and padding up to int64's
ends, devices of every tensor, dtype and compute type, workspace limit, alignment; a case
whose plan is made executes it on real, guarded buffers, or with a mutated execute call (NULL
plan or pointers, unaligned pointers, a short workspace). The fuzzer's own reading of the
header (`Case.valid`) says whether the call must succeed or be refused, and each outcome gets
one category:

  ok-valid          valid, served (or refused UNSUPPORTED: the header allows it)
  refused-invalid   invalid, refused with INVALID_ARGUMENT or UNSUPPORTED
  refused-valid     valid, refused with INVALID_ARGUMENT, VENDOR, INTERNAL (a wrong refusal)
  accepted-invalid  invalid, yet served (or a workspace_size above workspace_limit)
  wrong-code        invalid, refused with VENDOR, INTERNAL or OUT_OF_MEMORY (not the header's)
  wrote-on-error    refused, but an out field was written
  memory            a buffer's guard bytes changed (written out of bounds)
  crash             the process died (signal); replayed alone to name the case
  hang              no answer within --timeout seconds
  wrong             valid, executed, but an element of the written tensor (y, dx, dw, the
                    bias gradient) differs from the float64 reference here, or was left
                    unwritten (outputs are NaN before the call unless beta reads them)
  any               a mutation the header leaves open (unknown flags, algo_id), no crash
  fuzzer-error      the fuzzer itself raised (its bug, not the shim's: fix it)

Every plan a valid case executes gets random inputs (quarters in [-1, 1], exact in every
dtype) written through its descriptors' strides, and its result is compared with a float64
reference (tests/reference.py's convolutions, the epilogue out = alpha * act(conv + bias) +
beta * out written below) within a tolerance per dtype.

Every case is a pure function of (seed, index): `--seed S --case I` replays one case alone,
and each bad outcome is printed with that one-line reproducer.

  python tests/abi_fuzz/fuzz.py                         # as CI: every shim, seeds 1-3 and a fresh one, 2000 each
  python tests/abi_fuzz/fuzz.py --shim onednn --seed 7 --cases 100000   # the longer run
  python tests/abi_fuzz/fuzz.py --shim onednn --seed 7 --case 123 -v    # one case, alone
"""

from __future__ import annotations

import argparse
import collections
import ctypes as C
import json
import os
import pathlib
import random
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the ABI suite's ctypes mirror and shim list

import reference as ref  # noqa: E402 -- tests/reference.py: float64 convolutions
from abi import fdnn_ctypes as F  # noqa: E402
from abi.fdnn_ctypes import ABI  # noqa: E402

INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1
GUARD = 64  # bytes of 0xA5 before and after every buffer
POISON = 0xA5
SENTINEL = 0x5EED  # out fields are preset to this: an error must leave them so
BAD_CATEGORIES = (
    "crash",
    "hang",
    "accepted-invalid",
    "wrong-code",
    "wrote-on-error",
    "memory",
    "wrong",
    "fuzzer-error",
)
CATEGORIES = ("ok-valid", "refused-invalid", "refused-valid", "any") + BAD_CATEGORIES
DTYPES = {"float32": (2, 32), "float64": (2, 64), "float16": (2, 16), "bfloat16": (4, 16)}

# ---------------------------------------------------------------------------------------------
# A description: plain Python values, mutated freely, then turned into ctypes structs.


def compact_strides(shape, order):
    """Strides of a dense tensor whose dims, from innermost out, are `order`."""
    strides, step = [0] * len(shape), 1
    for d in order:
        strides[d] = step
        step *= shape[d]
    return strides


def out_size(x, k, stride, dil, lo, hi):
    """The output size by the header's formula in Python's integers; None where an
    intermediate leaves int64 (the header's rule) or the output is empty."""
    if stride < 1 or dil < 1 or lo < 0 or hi < 0:
        return None
    extent = dil * (k - 1) + 1
    padded = x + lo + hi
    if max(abs(extent), abs(padded)) > INT64_MAX:
        return None
    return (padded - extent) // stride + 1 if padded >= extent else None


def host_memory_devices() -> tuple:
    """The device types whose memory is host memory here: the CPU, ROCm when the MIOpen
    shim runs on its test double (.ci/fuzz.sh sets FLUX_DNN_FUZZ_ROCM_DOUBLE=1 with
    FLUX_DNN_MIOPEN_LIBRARY; never with FLUX_DNN_MIOPEN_REAL=1, a real AMD GPU), and the
    device of a shim whose memory the host reaches (DEVICE_MEMORY below: USM shared memory on
    a SYCL device), which the host reads and writes through its pointers as host memory."""
    double = os.environ.get("FLUX_DNN_FUZZ_ROCM_DOUBLE") == "1" and os.environ.get("FLUX_DNN_MIOPEN_REAL") != "1"
    found = (ABI.DEVICE_CPU, ABI.DEVICE_ROCM) if double else (ABI.DEVICE_CPU,)
    memory = DEVICE_MEMORY.get("memory")
    return found + ((memory.device_type,) if memory is not None else ())


#: {"memory": the host-visible memory of the fuzzed shim's device} once use_device_memory()
#: found one (abi/device_memory.py: registered by a plug-in, e.g. SYCL's USM shared memory);
#: Buffer then allocates there and every execute and pack passes its stream. Empty: host
#: buffers only.
DEVICE_MEMORY: dict = {}


def use_device_memory(device_type: int) -> None:
    """Sets DEVICE_MEMORY up when the device has host-visible memory here (the shim's own
    preload ran first, so its runtime sees its devices)."""
    from abi import device_memory  # noqa: PLC0415 -- pytest's module, imported by the child only

    memory = device_memory.for_device(device_type)
    if memory is not None:
        DEVICE_MEMORY["memory"] = memory


def device_stream():
    memory = DEVICE_MEMORY.get("memory")
    return None if memory is None else memory.stream()


class Tensor:
    def __init__(self, shape, dtype, order=None):
        self.shape = list(shape)
        self.order = order or list(reversed(range(len(shape))))
        self.strides = compact_strides(self.shape, self.order)
        self.dtype = list(dtype) + [1]  # code, bits, lanes
        self.device = [ABI.DEVICE_CPU, 0]
        self.ndim = len(shape)
        self.null_shape = self.null_strides = False
        self.byte_offset = 0
        self.misalign = 0  # bytes added to the data pointer

    def restride(self):
        self.strides = compact_strides(self.shape, self.order)


class Case:
    """One call sequence: Conv_Plan_Create, then (when it succeeds) Conv_Plan_Execute."""

    def __init__(self, rng: random.Random, device_type: int, num_devices: int):
        self.rng = rng
        self.notes = []  # the mutations, in words
        self.verdict = "valid"  # valid, invalid or any
        op = rng.choice([0, 1, 2])
        rank = rng.choice([1, 2, 2, 3])
        dtype = DTYPES[rng.choice(["float32", "float32", "float64", "float16", "bfloat16"])]
        g = rng.choice([1, 1, 1, 2, 3])
        cg, kg = rng.randint(1, 3), rng.randint(1, 3)
        n = rng.randint(1, 2)
        sp = [rng.randint(1, 6) for _ in range(rank)]
        ks = [rng.randint(1, 3) for _ in range(rank)]
        self.stride = [rng.choice([1, 1, 2]) for _ in range(rank)]
        self.dilation = [rng.choice([1, 1, 2]) for _ in range(rank)]
        self.lo = [rng.randint(0, 2) for _ in range(rank)]
        self.hi = [rng.randint(0, 2) for _ in range(rank)]
        for i in range(rank):  # padded input at least the dilated kernel
            need = self.dilation[i] * (ks[i] - 1) + 1 - (sp[i] + self.lo[i] + self.hi[i])
            if need > 0:
                sp[i] += need
        last = rng.random() < 0.3  # channels-last
        order = ([1] + list(reversed(range(2, rank + 2))) + [0]) if last else None
        self.op, self.rank, self.groups = op, rank, g
        self.x = Tensor([n, cg * g] + sp, dtype, order)
        self.w = Tensor([kg * g, cg] + ks, dtype, order)
        ys = [out_size(sp[i], ks[i], self.stride[i], self.dilation[i], self.lo[i], self.hi[i]) for i in range(rank)]
        self.y = Tensor([n, kg * g] + ys, dtype, order)
        self.bias = Tensor([kg * g], dtype) if op != 1 and rng.random() < 0.4 else None
        self.null = {"x": False, "w": False, "y": False, "bias": False}
        self.alpha, self.beta = rng.choice([(1.0, 0.0), (1.0, 0.0), (0.5, 0.25)])
        self.activation = rng.choice([0, 0, 1, 2, 3, 4, 8]) if op == 0 else 0
        self.act_a, self.act_b = -0.5, 0.5
        self.compute = [0, 0, 0]
        self.flags = 0
        self.policy = rng.choice([0, 0, 0, 1])
        self.algo_id = 0
        self.workspace_limit = SIZE_MAX
        self.struct_size_delta = 0
        # Descriptors carry data pointers (host memory: CPU shims, and the MIOpen shim on its
        # test double), and plans execute.
        self.with_data = device_type in host_memory_devices()
        self.device_type, self.num_devices = device_type, num_devices
        for t in self.tensors():
            t.device[0] = device_type
        self.execute = None  # mutation of the execute call, or None for a plain one
        self.rank_field = None  # spatial_rank as written to the struct, when mutated
        self.pack = None  # mutation of a Conv_Plan_Pack_Weights call, when the case packs
        self.capabilities = None  # (op, device_id, dtype) when the case asks Conv_Capabilities

    def tensors(self):
        return [t for t in (self.x, self.w, self.y, self.bias) if t is not None]

    def written(self):
        """The tensors the op writes (the header: FORWARD y, BACKWARD_DATA x, BACKWARD_WEIGHT w
        and the bias gradient)."""
        return {0: [self.y], 1: [self.x], 2: [self.w, self.bias]}.get(self.op, [])

    def mark(self, verdict: str, note: str):
        self.notes.append(note)
        if verdict == "invalid":
            self.verdict = "invalid"
        elif verdict == "any" and self.verdict == "valid":
            self.verdict = "any"

    def resize(self):
        """Recomputes y's spatial dims from x, w and the parameters (a valid geometry)."""
        for i in range(self.rank):
            o = out_size(
                self.x.shape[2 + i], self.w.shape[2 + i], self.stride[i], self.dilation[i], self.lo[i], self.hi[i]
            )
            if o is None:
                return False
            self.y.shape[2 + i] = o
        self.y.restride()
        return True


# ---------------------------------------------------------------------------------------------
# Mutations: each changes one field (or a consistent group) and says whether the result is
# still valid by the header.

HUGE = [2**31 - 1, 2**31, 2**32, 2**62, INT64_MAX, -1, -(2**63), 0]


def pick_tensor(c: Case, with_bias=True):
    names = ["x", "w", "y"] + (["bias"] if with_bias and c.bias is not None else [])
    name = c.rng.choice(names)
    return name, getattr(c, name)


def m_null_descriptor(c):
    name = c.rng.choice(["x", "w", "y", "bias"])
    c.null[name] = True
    c.mark("invalid", f"{name}=NULL")


def m_null_shape_or_strides(c):
    name, t = pick_tensor(c)
    if c.rng.random() < 0.5:
        t.null_shape = True
        c.mark("invalid", f"{name}.shape=NULL")
    else:
        t.null_strides = True
        c.mark("invalid", f"{name}.strides=NULL")


def m_struct_size(c):
    c.struct_size_delta = -c.rng.choice([1, 8, 64, F.struct_size(F.ConvPlanCreateArgs)])
    c.mark("invalid", f"struct_size{c.struct_size_delta:+d}")


def m_enum(c):
    field = c.rng.choice(["op", "activation", "algo_policy", "spatial_rank"])
    value = c.rng.choice([-1, 3, 4, 9, 100, 2**31 - 1, -(2**31)])
    if field == "spatial_rank" and value == c.rank:
        value = 4
    if field == "activation" and value in (3, 4):
        value = 9
    if field == "spatial_rank":
        c.rank_field = value  # c.rank stays: the tensors keep their rank
    else:
        setattr(c, {"algo_policy": "policy"}.get(field, field), value)
    c.mark("invalid", f"{field}={value}")


def m_rank_mismatch(c):
    name, t = pick_tensor(c, with_bias=False)
    t.ndim = c.rng.choice([0, 1, t.ndim - 1, t.ndim + 1, 6, -1, 2**31 - 1])
    t.ndim = t.ndim if t.ndim != len(t.shape) else t.ndim + 1
    c.mark("invalid", f"{name}.ndim={t.ndim}")


def m_bias_ndim(c):
    if c.bias is None:
        c.bias = Tensor([c.w.shape[0]], c.x.dtype[:2])
        c.bias.device = list(c.x.device)
    c.bias.ndim = c.rng.choice([-1, -(2**31), 2, 5])
    c.mark("invalid", f"bias.ndim={c.bias.ndim}")


def geometry_ok(c):
    """The header's shape rules: channels fit the groups, y = (N, K, the output sizes), bias
    (K,)."""
    x, w, y, g = c.x.shape, c.w.shape, c.y.shape, c.groups
    if g < 1 or x[1] % g or w[0] % g or x[1] // g != w[1] or y[:2] != [x[0], w[0]]:
        return False
    if c.bias is not None and c.bias.shape != [w[0]]:
        return False
    outs = [out_size(x[2 + i], w[2 + i], c.stride[i], c.dilation[i], c.lo[i], c.hi[i]) for i in range(c.rank)]
    return outs == y[2:]


def m_bad_dim(c):
    name, t = pick_tensor(c)
    i = c.rng.randrange(len(t.shape))
    t.shape[i] = c.rng.choice([0, -1, -(2**63), t.shape[i] + 1])
    t.restride()
    still = t.shape[i] >= 1 and geometry_ok(c)  # x one wider may give the same output size
    c.mark(
        "valid" if still else "invalid", f"{name}.shape[{i}]={t.shape[i]}" + (" (still consistent)" if still else "")
    )


def m_groups(c):
    c.groups = c.rng.choice([0, -1, c.groups + 1, 2**62, INT64_MAX, -(2**63)])
    c.mark("invalid", f"groups={c.groups}")


def m_bad_param(c):
    field = c.rng.choice(["stride", "dilation", "lo", "hi"])
    i = c.rng.randrange(c.rank)
    getattr(c, field)[i] = c.rng.choice([0, -1, -(2**63)] if field in ("stride", "dilation") else [-1, -(2**63)])
    c.mark("invalid", f"{field}[{i}]={getattr(c, field)[i]}")


def m_huge_param(c):
    """A huge stride, dilation or padding: valid when y follows (with no data to touch),
    invalid when an intermediate of the output size leaves int64 (the header's rule)."""
    field = c.rng.choice(["stride", "dilation", "lo", "hi", "both"])
    i = c.rng.randrange(c.rank)
    v = c.rng.choice([2**31, 2**32, 2**62, INT64_MAX])
    if field == "both":
        c.lo[i] = c.hi[i] = v
    else:
        getattr(c, field)[i] = v
    c.with_data = False
    note = f"{field}[{i}]={v}"
    if c.resize() and extents_fit(c):
        c.mark("valid", note + " (y follows)")
    else:
        c.mark("invalid", note + " (the output size leaves int64)")


def extent(t: Tensor):
    """Elements from the first to one past the last, by shape and strides (Python ints)."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.strides))


def extents_fit(c):
    """The header's largest extent: each tensor's byte extent, and its element count, fit in
    int64."""
    for t in c.tensors():
        esize = max(t.dtype[1] // 8, 1)
        count = 1
        for s in t.shape:
            count *= s
        if extent(t) * esize > INT64_MAX or count * esize > INT64_MAX:
            return False
    return True


def m_huge_dim(c):
    """A dimension of 2^31 and beyond with consistent shapes and compact strides: valid by the
    header while extents fit int64 (a shim refuses with UNSUPPORTED what its vendor cannot
    index), invalid beyond."""
    which = c.rng.choice(["N", "C", "K", "spatial", "kernel"])
    v = c.rng.choice([2**31 - 1, 2**31, 2**32, 2**40, 2**62, INT64_MAX])
    c.with_data = False
    if which == "N":
        c.x.shape[0] = c.y.shape[0] = v
    elif which == "C":
        c.w.shape[1] = v
        c.x.shape[1] = v * c.groups
    elif which == "K":
        c.w.shape[0] = c.y.shape[1] = v * c.groups
        if c.bias is not None:
            c.bias.shape[0] = v * c.groups
    elif which == "spatial":
        c.x.shape[2 + c.rng.randrange(c.rank)] = v
    else:
        i = c.rng.randrange(c.rank)
        c.w.shape[2 + i] = v
        c.x.shape[2 + i] = max(c.x.shape[2 + i], v * c.dilation[i])
    for t in c.tensors():
        t.restride()
    ok = c.resize() and all(abs(s) <= INT64_MAX for t in c.tensors() for s in t.shape + t.strides) and extents_fit(c)
    c.mark("valid" if ok else "invalid", f"{which}={v}" + ("" if ok else " (an extent leaves int64)"))


def m_strides(c):
    name, t = pick_tensor(c)
    i = c.rng.randrange(len(t.shape))
    kind = c.rng.choice(["zero", "negative", "huge", "gap"])
    if kind == "zero":
        t.strides[i] = 0
        if t.shape[i] > 1 and t in c.written():
            c.mark("invalid", f"{name}.strides[{i}]=0 on a written tensor (overlap)")
        else:
            c.mark("valid", f"{name}.strides[{i}]=0 (read: broadcast)")
    elif kind == "negative":
        t.strides[i] = -max(t.strides[i], 1)
        c.mark("invalid", f"{name}.strides[{i}]={t.strides[i]}")
    elif kind == "huge":
        t.strides[i] = c.rng.choice([2**31, 2**40, 2**62, INT64_MAX])
        c.with_data = False
        fits = extents_fit(c)
        if t.shape[i] == 1:
            c.mark("valid" if fits else "invalid", f"{name}.strides[{i}]={t.strides[i]} (of a dim of 1)")
        else:
            c.mark("valid" if fits else "invalid", f"{name}.strides[{i}]={t.strides[i]}")
    else:  # a padded layout: the outermost dim steps further than dense (valid, not dense)
        outer = t.order[-1]
        t.strides[outer] += c.rng.choice([1, 7, 64])
        c.mark("valid", f"{name}.strides[{outer}]={t.strides[outer]} (gap)")


def m_device(c):
    names = ["x", "w", "y"] + ["bias"]
    name = c.rng.choice(names)
    if name == "bias" and c.bias is None:
        c.bias = Tensor([c.w.shape[0]], c.x.dtype[:2])
        c.bias.device = list(c.x.device)
        if c.op == 1:
            c.mark("invalid", "bias on backward_data")
    t = getattr(c, name)
    if c.rng.random() < 0.5:
        others = [d for d in (1, 2, 8, 10, 14, 0, -1) if d != c.device_type]
        t.device[0] = c.rng.choice(others)
        c.mark("invalid", f"{name}.device_type={t.device[0]}")
    else:
        t.device[1] = c.rng.choice([c.num_devices, -1, 2**31 - 1, -(2**31)])
        c.mark("invalid", f"{name}.device_id={t.device[1]} ({c.num_devices} devices)")


def m_dtype(c):
    name, t = pick_tensor(c)
    kind = c.rng.choice(["lanes", "mixed", "code", "bits"])
    if kind == "lanes":
        t.dtype[2] = c.rng.choice([0, 2, 4, 65535])
        c.mark("invalid", f"{name}.dtype.lanes={t.dtype[2]}")
    elif kind == "mixed":
        other = [d for d in DTYPES.values() if list(d) != t.dtype[:2]]
        t.dtype[:2] = list(c.rng.choice(other))
        c.mark("invalid", f"{name}.dtype={t.dtype[:2]} (differs from the others)")
    else:
        for u in c.tensors():
            if kind == "code":
                u.dtype[0] = c.rng.choice([0, 1, 3, 5, 6, 255])
            else:
                u.dtype[1] = c.rng.choice([0, 1, 7, 8, 12, 128, 255])
        code, bits = c.x.dtype[:2]
        if bits % 8 or bits == 0:
            c.mark("invalid", f"dtype=(code {code}, bits {bits}) (bits not whole bytes)")
        else:
            c.mark("any", f"dtype=(code {code}, bits {bits}) (valid, not computed: UNSUPPORTED)")


def m_compute_type(c):
    kind = c.rng.choice(["lanes", "other"])
    if kind == "lanes":
        c.compute = [2, 32, c.rng.choice([0, 2, 16])]
        c.mark("invalid", f"compute_type.lanes={c.compute[2]}")
    else:
        c.compute = [c.rng.choice([0, 1, 2, 4, 9]), c.rng.choice([0, 8, 16, 32, 64, 3]), 1]
        if c.compute[:2] == [0, 0]:
            c.mark("valid", "compute_type=default")
        elif c.compute[1] % 8 or c.compute[1] == 0:
            c.mark("invalid", f"compute_type={c.compute[:2]} (bits not whole bytes)")
        else:
            c.mark("any", f"compute_type={c.compute[:2]}")


def m_flags(c):
    c.flags = c.rng.choice([1, 2, 3, 4, 0x80000000, 0xFFFFFFFF])
    c.mark("valid" if c.flags <= 3 else "any", f"flags={c.flags:#x}")


def m_policy(c):
    if c.policy not in (0, 1):  # already outside the enum: leave it so
        return m_workspace_limit(c)
    c.policy = c.rng.choice([1, 2])
    if c.policy == 2:
        c.algo_id = c.rng.choice([0, 1, 3, 7, 8, -1, 2**62])
        c.mark("any", f"algo_policy=given algo_id={c.algo_id}")
    else:
        c.mark("valid", "algo_policy=benchmark")


def m_workspace_limit(c):
    c.workspace_limit = c.rng.choice([0, 1, 64, 256, 4096])
    c.mark("valid", f"workspace_limit={c.workspace_limit}")


def m_alignment(c):
    name, t = pick_tensor(c)
    esize = max(t.dtype[1] // 8, 1)
    if esize == 1 or t.misalign or t.byte_offset:  # a second shift could realign it
        return m_null_descriptor(c)
    if c.rng.random() < 0.5:
        t.byte_offset = c.rng.randrange(1, esize)
        c.mark("invalid", f"{name}.byte_offset={t.byte_offset} (not element-aligned)")
    else:
        t.misalign = c.rng.randrange(1, esize)
        c.mark("invalid", f"{name}.data+{t.misalign} (not element-aligned)")


def m_extension(c):
    c.extension = True
    c.mark("valid", "extension_start=an extension of unknown type 999")


def m_execute(c):
    c.execute = c.rng.choice(
        ["null_plan", "null_args", "struct_size", "null_pointer", "unaligned", "short_workspace", "null_workspace"]
    )
    c.mark("valid", f"(plan) execute:{c.execute}")


def m_pack(c):
    """Conv_Plan_Pack_Weights of the case's plan (forward plans of shims that pack)."""
    c.pack = c.rng.choice(["plain", "null_w", "unaligned_w", "null_plan", "struct_size", "null_args"])
    c.mark("valid", f"(plan) pack:{c.pack}")


def m_capabilities(c):
    """Conv_Capabilities instead of a plan: an op or device_id out of range is invalid; any
    dtype is a valid question (answered NONE when not computed)."""
    op = c.rng.choice([0, 1, 2, 3, -1, 2**31 - 1, -(2**31)])
    device = c.rng.choice([0, 0, 0, c.num_devices, -1])
    dtype = [c.rng.choice([0, 1, 2, 4, 5, 255]), c.rng.choice([0, 8, 16, 32, 64, 255]), c.rng.choice([1, 1, 0, 4])]
    c.capabilities = (op, device, dtype)
    ok = 0 <= op <= 2 and 0 <= device < c.num_devices
    c.mark("valid" if ok else "invalid", f"capabilities(op {op}, device_id {device}, dtype {dtype})")


MUTATIONS = [
    m_pack,
    m_capabilities,
    m_null_descriptor,
    m_null_shape_or_strides,
    m_struct_size,
    m_enum,
    m_rank_mismatch,
    m_bias_ndim,
    m_bad_dim,
    m_groups,
    m_bad_param,
    m_huge_param,
    m_huge_dim,
    m_huge_dim,
    m_strides,
    m_strides,
    m_device,
    m_dtype,
    m_compute_type,
    m_flags,
    m_policy,
    m_workspace_limit,
    m_workspace_limit,
    m_alignment,
    m_extension,
    m_execute,
    m_execute,
    m_execute,
]


def make_case(seed: int, index: int, device_type: int, num_devices: int) -> Case:
    rng = random.Random(f"{seed}:{index}")
    c = Case(rng, device_type, num_devices)
    c.extension = False
    if rng.random() < 0.08:
        c.notes.append("(no mutation)")
    else:
        first = rng.choice(MUTATIONS)
        first(c)
        # A second mutation, of another kind (so none undoes the first); a capabilities case
        # asks that question alone.
        if rng.random() < 0.3 and first is not m_capabilities:
            rng.choice([m for m in MUTATIONS if m not in (first, m_capabilities)])(c)
    return c


# ---------------------------------------------------------------------------------------------
# Running one case


class Buffer:
    """Bytes with GUARD poisoned bytes on each side; `intact` says whether they still are."""

    def __init__(self, nbytes: int, align: int = 64):
        self.nbytes = nbytes
        memory = DEVICE_MEMORY.get("memory")
        if memory is not None:  # the device's memory, readable and writable by the host
            self.raw = memory.empty((nbytes + 2 * GUARD + align,), np.uint8)
            base = self.raw.ctypes.data
        else:
            self.raw = C.create_string_buffer(nbytes + 2 * GUARD + align)
            base = C.addressof(self.raw)
        self.start = (base + GUARD + align - 1) // align * align
        C.memset(self.start - GUARD, POISON, GUARD)
        C.memset(self.start + nbytes, POISON, GUARD)

    def intact(self) -> bool:
        return (
            C.string_at(self.start - GUARD, GUARD) == bytes([POISON]) * GUARD
            and C.string_at(self.start + self.nbytes, GUARD) == bytes([POISON]) * GUARD
        )


# ---------------------------------------------------------------------------------------------
# Numbers: the inputs of an executed plan, and its result against a float64 reference

#: FDNN_ACTIVATION_* -> tests/reference.py's name; parameters from activation_alpha/_beta.
ACTIVATION_NAMES = {
    1: "relu",
    2: "leaky_relu",
    3: "clip",
    4: "sigmoid",
    5: "tanh",
    6: "gelu_tanh",
    7: "gelu",
    8: "silu",
}
#: Tolerance relative to max(1, |expected|) per (dtype code, bits): float32 sums of quarters
#: are exact, a 16-bit result is rounded once or twice, an activation adds its own arithmetic.
TOLERANCE = {(2, 64): 1e-12, (2, 32): 2e-4, (2, 16): 2e-3, (4, 16): 1e-2}
NUMPY_TYPES = {(2, 64): np.float64, (2, 32): np.float32, (2, 16): np.float16, (4, 16): np.uint16}
COMPARED = "result compared"  # the detail of an ok-valid case whose result matched the reference


def element_view(buffer: Buffer, t: Tensor) -> np.ndarray:
    """t's elements in buffer, through its shape and strides (bfloat16 as its uint16 bits)."""
    esize = t.dtype[1] // 8
    raw = (C.c_ubyte * buffer.nbytes).from_address(buffer.start + t.misalign + t.byte_offset)
    return np.ndarray(
        tuple(t.shape),
        NUMPY_TYPES[tuple(t.dtype[:2])],
        buffer=raw,
        strides=tuple(s * esize for s in t.strides),
    )


def to_float64(view: np.ndarray, dtype) -> np.ndarray:
    if tuple(dtype[:2]) == (4, 16):  # bfloat16: the high half of a float32
        return (np.ascontiguousarray(view).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return view.astype(np.float64)


def from_float64(values: np.ndarray, dtype) -> np.ndarray:
    if tuple(dtype[:2]) == (4, 16):  # exact for the values written here (quarters, NaN)
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(NUMPY_TYPES[tuple(dtype[:2])])


def epilogue(result, alpha, beta, old, activation=None):
    """out = alpha * act(result) + beta * out_old, in float64 (result includes the bias); beta
    = 0 does not read out_old (it is NaN)."""
    out = alpha * ref.activate(result, activation)
    return out + beta * old if beta != 0.0 else out


class Numbers:
    """Writes random inputs into the read tensors of a valid case (through their strides, so a
    broadcast stride reads what the last write left), NaN into the written ones (or random
    old values where beta reads them), and keeps the float64 reference of the result."""

    def __init__(self, c: Case, buffers: dict):
        self.c = c
        self.rng = np.random.default_rng(c.rng.getrandbits(64))
        self.views = {}
        reads = {0: ["x", "w", "bias"], 1: ["y", "w"], 2: ["x", "y"]}[c.op]
        writes = {0: ["y"], 1: ["x"], 2: ["w", "bias"]}[c.op]
        values = {}
        for name in reads + writes:
            t = getattr(c, name)
            if t is None:
                continue
            view = self.views[name] = element_view(buffers[name], t)
            if name in writes:  # the whole buffer, gaps included
                whole = buffers[name].nbytes // (t.dtype[1] // 8)
                flat = Tensor([whole], t.dtype[:2])
                element_view(buffers[name], flat)[...] = from_float64(np.full(whole, np.nan), t.dtype)
                if c.beta == 0.0:
                    values[name] = None
                    continue
            view[...] = from_float64(self.rng.integers(-4, 5, t.shape) / 4, t.dtype)
            values[name] = to_float64(view, t.dtype)  # what the shim reads (a 0 stride: the last write)
        geometry = (c.stride[: c.rank], c.lo[: c.rank], c.hi[: c.rank], c.dilation[: c.rank], c.groups)
        self.expected = {}
        if c.op == 0:
            conv = ref.conv_forward(values["x"], values["w"], values.get("bias"), *geometry)
            activation = None
            if c.activation:
                activation = (ACTIVATION_NAMES[c.activation],) + {2: (c.act_a,), 3: (c.act_a, c.act_b)}.get(
                    c.activation, ()
                )
            self.expected["y"] = epilogue(conv, c.alpha, c.beta, values["y"], activation)
        elif c.op == 1:
            dx = ref.conv_backward_data(values["y"], values["w"], tuple(c.x.shape), *geometry)
            self.expected["x"] = epilogue(dx, c.alpha, c.beta, values["x"])
        else:
            dw = ref.conv_backward_weight(values["x"], values["y"], tuple(c.w.shape), *geometry)
            self.expected["w"] = epilogue(dw, c.alpha, c.beta, values["w"])
            if c.bias is not None:  # the bias gradient, with the same alpha and beta
                db = values["y"].sum(axis=(0, *range(2, c.rank + 2)))
                self.expected["bias"] = epilogue(db, c.alpha, c.beta, values["bias"])

    def what(self) -> str:
        c = self.c
        dtype = {v: k for k, v in DTYPES.items()}.get(tuple(c.x.dtype[:2]), c.x.dtype[:2])
        return (
            f"op {c.op}, {dtype}, alpha {c.alpha}, beta {c.beta}, activation {c.activation}, "
            f"policy {c.policy}, flags {c.flags:#x}"
        )

    def check(self) -> str:
        """'' when every written element matches the reference, else what differs."""
        for name, expected in self.expected.items():
            t = getattr(self.c, name)
            got = to_float64(self.views[name], t.dtype)
            unwritten = int(np.isnan(got).sum())
            if unwritten:
                return f"{name}: {unwritten} of {got.size} elements unwritten (NaN)"
            tol = TOLERANCE[tuple(t.dtype[:2])]
            if self.c.flags & ABI.CONV_ALLOW_REDUCED_PRECISION:
                tol = max(tol, TOLERANCE[(4, 16)])  # float32 computed in bfloat16 is allowed
            diff = np.abs(got - expected)
            bound = tol * max(1.0, float(np.abs(expected).max(initial=0.0)))
            if diff.size and float(diff.max()) > bound:
                i = np.unravel_index(int(diff.argmax()), diff.shape)
                bad = int((diff > bound).sum())
                return (
                    f"{name}: {bad} of {diff.size} elements off, the worst by {float(diff.max()):.4g} at "
                    f"{tuple(int(v) for v in i)} (got {got[i]:.6g}, expected {expected[i]:.6g})"
                )
        return ""


MAX_BUFFER = 1 << 24
FAKE_ADDRESS = 1 << 20  # a data pointer that plan creation may check but never reads


def c_tensor(t: Tensor | None, keep: list, buffers: dict, name: str, with_data: bool):
    if t is None:
        d = F.DLTensor(ndim=0)
        d.device = F.DLDevice(ABI.DEVICE_CPU, 0)
        return d
    n = len(t.shape)
    room = max(n, min(max(t.ndim, 0), 16), 1)  # a mutated ndim reads no further than it says
    shape = (C.c_int64 * room)(*[wrap64(v) for v in t.shape])
    strides = (C.c_int64 * room)(*[wrap64(v) for v in t.strides])
    keep += [shape, strides]
    data = None
    esize = max(t.dtype[1] // 8, 1)
    span = extent(t) * esize if all(s >= 1 for s in t.shape) else 0
    if with_data and 0 < span <= MAX_BUFFER and t.ndim == n:
        buffers[name] = Buffer(span + t.misalign)
        data = buffers[name].start + t.misalign
    elif t.misalign or t.byte_offset:  # no buffer, yet a pointer whose alignment is the case
        data = FAKE_ADDRESS + t.misalign
    d = F.DLTensor(
        data=data,
        device=F.DLDevice(*t.device),
        ndim=t.ndim,
        dtype=F.DLDataType(t.dtype[0] % 256, t.dtype[1] % 256, t.dtype[2] % 65536),
        shape=None if t.null_shape else C.cast(shape, C.POINTER(C.c_int64)),
        strides=None if t.null_strides else C.cast(strides, C.POINTER(C.c_int64)),
        byte_offset=t.byte_offset,
    )
    return d


def wrap64(v):
    return ((v + 2**63) % 2**64) - 2**63


def wrap32(v):
    return ((v + 2**31) % 2**32) - 2**31


def build_args(c: Case, keep: list, buffers: dict):
    ds = {}
    for name in ("x", "w", "y", "bias"):
        ds[name] = c_tensor(getattr(c, name), keep, buffers, name, c.with_data)
    keep.append(ds)
    a = F.new(F.ConvPlanCreateArgs)
    a.op = wrap32(c.op)
    a.spatial_rank = wrap32(c.rank if c.rank_field is None else c.rank_field)
    for name in ("x", "w", "y", "bias"):
        setattr(a, name, None if c.null[name] else C.pointer(ds[name]))
    for i in range(c.rank):
        a.stride[i], a.dilation[i] = wrap64(c.stride[i]), wrap64(c.dilation[i])
        a.padding_lo[i], a.padding_hi[i] = wrap64(c.lo[i]), wrap64(c.hi[i])
    a.groups = wrap64(c.groups)
    a.alpha, a.beta = c.alpha, c.beta
    a.activation, a.activation_alpha, a.activation_beta = wrap32(c.activation), c.act_a, c.act_b
    a.compute_type = F.DLDataType(*c.compute)
    a.flags = c.flags
    a.algo_policy = wrap32(c.policy)
    a.algo_id = c.algo_id
    a.workspace_limit = c.workspace_limit
    if c.extension:
        ext = F.ExtensionBase(struct_size=F.struct_size(F.ExtensionBase), type=999, next=None)
        keep.append(ext)
        a.extension_start = C.pointer(ext)
    a.plan = SENTINEL
    a.workspace_size = SENTINEL
    a.chosen_algo_id = SENTINEL
    a.struct_size += c.struct_size_delta
    return a


def classify(c: Case, error) -> tuple:
    """(category, detail) of a plan creation outcome."""
    if c.verdict == "any":
        return "any", "" if error is None else error[0]
    if error is None:
        return ("ok-valid", "") if c.verdict == "valid" else ("accepted-invalid", "served")
    code, message = error
    if c.verdict == "valid":
        if code == "UNSUPPORTED" or (code == "OUT_OF_MEMORY"):
            return "ok-valid", code
        return "refused-valid", f"{code}: {message[:200]}"
    if code in ("INVALID_ARGUMENT", "UNSUPPORTED"):
        return "refused-invalid", code
    return "wrong-code", f"{code}: {message[:200]}"


def ask_capabilities(shim, c: Case) -> tuple:
    op, device, dtype = c.capabilities
    args = F.new(F.ConvCapabilitiesArgs, device_id=device, op=op, dtype=F.DLDataType(*dtype))
    args.support = args.spatial_ranks = args.features = SENTINEL
    error = shim.call("Conv_Capabilities", args)
    if error is not None and (args.support, args.spatial_ranks, args.features) != (SENTINEL,) * 3:
        return "wrote-on-error", f"{error[0]} yet support/spatial_ranks/features written"
    if error is None and args.support not in (ABI.SUPPORT_NONE, ABI.SUPPORT_NATIVE, ABI.SUPPORT_CONVERTED):
        return "accepted-invalid", f"support {args.support} is no FDNN_SUPPORT_* value"
    return classify(c, error)


def pack(shim, c: Case, a, buffers) -> tuple:
    """Conv_Plan_Pack_Weights of plan a.plan, mutated by c.pack; destroys a packed plan."""
    if c.op != 0 or not shim.api.Conv_Plan_Pack_Weights:
        return "ok-valid", "no packing here"
    kind = c.pack
    w = buffers["w"].start + c.w.misalign + c.w.byte_offset
    args = F.new(F.ConvPlanPackWeightsArgs, plan=a.plan, w=w, stream=device_stream())
    args.packed_plan, args.workspace_size = SENTINEL, SENTINEL
    if kind == "null_args":
        error = shim.call("Conv_Plan_Pack_Weights", None)
    else:
        if kind == "null_w":
            args.w = None
        elif kind == "unaligned_w":
            if max(c.w.dtype[1] // 8, 1) == 1:
                return "ok-valid", "1-byte elements: always aligned"
            args.w = w + 1
        elif kind == "null_plan":
            args.plan = None
        elif kind == "struct_size":
            args.struct_size -= 8
        error = shim.call("Conv_Plan_Pack_Weights", args)
    if error is None:
        shim.destroy(args.packed_plan)
        return ("ok-valid", "") if kind == "plain" else ("accepted-invalid", f"pack:{kind} served")
    if kind == "plain":
        return "refused-valid", f"pack: {error[0]}: {error[1][:200]}"
    if (args.packed_plan, args.workspace_size) != (SENTINEL, SENTINEL):
        return "wrote-on-error", f"pack:{kind}: {error[0]} yet packed_plan/workspace_size written"
    code_ok = error[0] == "INVALID_ARGUMENT"
    return ("refused-invalid" if code_ok else "wrong-code"), f"pack:{kind}: {error[0]}"


def run_case(shim, c: Case) -> tuple:
    if c.capabilities is not None:
        return ask_capabilities(shim, c)
    keep, buffers = [], {}
    a = build_args(c, keep, buffers)
    error = shim.call("Conv_Plan_Create", a)
    if error is not None:
        if a.plan != SENTINEL or a.workspace_size != SENTINEL or a.chosen_algo_id != SENTINEL:
            return "wrote-on-error", f"{error[0]} yet plan/workspace_size/chosen_algo_id written"
        if any(not b.intact() for b in buffers.values()):
            return "memory", "a guard byte changed on a failed plan creation"
        return classify(c, error)
    if a.workspace_size > c.workspace_limit:
        return "accepted-invalid", f"workspace_size {a.workspace_size} > workspace_limit {c.workspace_limit}"
    try:
        if c.verdict != "valid" or not c.with_data or not all(n in buffers for n in ("x", "w", "y")):
            return classify(c, None)
        if c.pack is not None:
            return pack(shim, c, a, buffers)
        return execute(shim, c, a, buffers)
    finally:
        shim.destroy(a.plan)


def execute(shim, c: Case, a, buffers) -> tuple:
    ws = Buffer(a.workspace_size)
    e = F.new(F.ConvPlanExecuteArgs, plan=a.plan, workspace=ws.start if a.workspace_size else None)
    e.stream = device_stream()
    e.workspace_size = a.workspace_size
    for name in ("x", "w", "y", "bias"):
        b = buffers.get(name)
        t = getattr(c, name)
        setattr(e, name, None if b is None else b.start + t.misalign + t.byte_offset)
    kind = c.execute
    invalid = True
    if kind == "null_plan":
        e.plan = None
    elif kind == "null_args":
        error = shim.call("Conv_Plan_Execute", None)
        if error is None:
            return "accepted-invalid", "execute(NULL args) served"
        if error[0] != "INVALID_ARGUMENT":
            return "wrong-code", f"execute(NULL args): {error[0]}"
        return "refused-invalid", "execute(NULL args)"
    elif kind == "struct_size":
        e.struct_size -= 8
    elif kind == "null_pointer":
        needed = {0: ["x", "w", "y"], 1: ["y", "w", "x"], 2: ["x", "y", "w"]}[c.op]
        setattr(e, c.rng.choice(needed), None)
    elif kind == "unaligned":
        esize = max(c.x.dtype[1] // 8, 1)
        name = c.rng.choice(["x", "w", "y"])
        if esize > 1:
            setattr(e, name, getattr(e, name) + 1)
        else:
            invalid = False
    elif kind == "short_workspace":
        if a.workspace_size == 0:
            invalid = False
        else:
            e.workspace_size = a.workspace_size - c.rng.choice([1, a.workspace_size])
    elif kind == "null_workspace":
        if a.workspace_size == 0:
            invalid = False
        e.workspace = None
    else:
        invalid = False
    numbers = None if invalid else Numbers(c, buffers)
    error = shim.call("Conv_Plan_Execute", e)
    if not all(b.intact() for b in list(buffers.values()) + [ws]):
        return "memory", f"execute({kind or 'plain'}) wrote past a buffer or the workspace"
    if invalid:
        if error is None:
            return "accepted-invalid", f"execute:{kind} served"
        if error[0] != "INVALID_ARGUMENT":
            return "wrong-code", f"execute:{kind}: {error[0]}"
        return "refused-invalid", f"execute:{kind}"
    if error is not None:
        return "refused-valid", f"execute: {error[0]}: {error[1][:200]}"
    wrong = numbers.check()
    if wrong:
        return "wrong", f"{wrong} ({numbers.what()}, {a.algo_name.decode(errors='replace') if a.algo_name else '?'})"
    return "ok-valid", COMPARED


# ---------------------------------------------------------------------------------------------
# Processes: a parent hands ranges of cases to a child and reads one line per case


def open_shim(name: str):
    from abi.shims import SOURCES  # noqa: PLC0415 -- pytest's module, imported by the child only

    source = SOURCES[name]
    if source.preload is not None:
        try:
            source.preload()
        except Exception:  # noqa: BLE001 -- the shim says what is missing itself
            pass
    return F.Shim(source.library)


def worker(shim_name: str, seed: int, start: int, stop: int) -> None:
    shim = open_shim(shim_name)
    info = shim.info()
    if info.device_type != ABI.DEVICE_CPU and info.num_devices > 0:
        use_device_memory(info.device_type)
    out = sys.stdout
    for i in range(start, stop):
        out.write(f"start {i}\n")
        out.flush()
        c = None
        try:
            c = make_case(seed, i, info.device_type, info.num_devices)
            category, detail = run_case(shim, c)
        except Exception as exc:  # noqa: BLE001 -- the fuzzer's own bug, reported as such
            category, detail = "fuzzer-error", f"{type(exc).__name__}: {exc}"
        notes = c.notes if c is not None else ["(the case could not be made)"]
        out.write(json.dumps({"i": i, "category": category, "detail": detail, "notes": notes}) + "\n")
        out.flush()


def reproducer(shim: str, seed: int, index: int) -> str:
    return f"python tests/abi_fuzz/fuzz.py --shim {shim} --seed {seed} --case {index} -v"


def run_range(shim: str, seed: int, start: int, stop: int, timeout: float, results: dict, verbose: bool) -> None:
    """Runs cases start..stop-1 in child processes, a new child after each crash or hang."""
    i = start
    while i < stop:
        cmd = [sys.executable, __file__, "--worker", "--shim", shim, "--seed", str(seed)]
        cmd += ["--start", str(i), "--stop", str(stop)]
        errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child never blocks on it
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, bufsize=0)
        current, deadline, hung = None, time.monotonic() + timeout + 30, False  # +30: the child's imports
        pending, done = b"", False
        while not done:
            # The pipe's own bytes, split here: a buffered reader could hold lines select() misses.
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                hung = True
                proc.kill()
                break
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            done = not chunk
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode()
                if line.startswith("start "):
                    current = int(line.split()[1])
                    deadline = time.monotonic() + timeout
                    continue
                r = json.loads(line)
                results[r["i"]] = r
                current = None
                if verbose or r["category"] in BAD_CATEGORIES:
                    report(shim, seed, r)
        proc.wait()
        proc.stdout.close()
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
        errors.close()
        if current is None:
            if proc.returncode != 0 and not hung:
                raise RuntimeError(f"the fuzz worker failed outside a case (exit {proc.returncode}):\n{stderr}")
            i = stop
            continue
        how = "hang" if hung else "crash"
        detail = f"no answer in {timeout:g} s" if hung else f"exit {proc.returncode} {tail(stderr)}"
        r = {"i": current, "category": how, "detail": detail, "notes": notes_of(seed, current)}
        results[current] = r
        report(shim, seed, r)
        i = current + 1


def notes_of(seed: int, index: int) -> list:
    """The mutations of a case, for the report of one that killed its child."""
    try:
        return make_case(seed, index, ABI.DEVICE_CPU, 1).notes
    except Exception as exc:  # noqa: BLE001
        return [f"(the case could not be made: {exc})"]


def tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return ("(" + lines[-1][:160] + ")") if lines else ""


def report(shim: str, seed: int, r: dict) -> None:
    print(
        f"  {r['category']:16s} {shim} seed {seed} case {r['i']}: {'; '.join(r['notes'])}"
        f"{' -> ' + r['detail'] if r['detail'] else ''}\n      repro: {reproducer(shim, seed, r['i'])}",
        flush=True,
    )


def fuzz(shim: str, seeds: list, cases: int, batch: int, timeout: float, verbose: bool) -> tuple:
    """(counts per category, how many executed plans were compared with the reference)."""
    counts, compared = collections.Counter(), 0
    for seed in seeds:
        results: dict = {}
        for start in range(0, cases, batch):
            run_range(shim, seed, start, min(start + batch, cases), timeout, results, verbose)
        counts.update(r["category"] for r in results.values())
        compared += sum(r["detail"] == COMPARED or r["category"] == "wrong" for r in results.values())
    return counts, compared


def usable_shims() -> list:
    """The shim libraries installed or named by FLUX_DNN_<NAME>_SHIM (tests/abi/shims.py)
    that can plan here; one that cannot (no driver, no device) is named with its reason."""
    from abi.shims import SOURCES  # noqa: PLC0415

    usable = []
    for name, source in sorted(SOURCES.items()):
        if not source.library or source.missing:
            continue
        why = open_shim(name).reason()
        if why is None:
            usable.append(name)
        else:
            print(f"not fuzzed: {name} cannot plan here ({why})")
    return usable


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shim", action="append", help="shim (entry point or FLUX_DNN_<NAME>_SHIM); default: every one")
    p.add_argument("--seed", type=int, action="append", help="seed (repeatable); default: the CI list and one fresh")
    p.add_argument("--cases", type=int, default=2000, help="cases per shim and seed")
    p.add_argument("--case", type=int, help="run this one case alone, in this process")
    p.add_argument("--batch", type=int, default=500, help="cases per child process")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds one case may take before it counts as a hang")
    p.add_argument("--json", help="write the counts per shim and category here")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.shim[0], args.seed[0], args.start, args.stop)
        return 0
    shims = args.shim or usable_shims()
    if args.case is not None:
        seed = (args.seed or [0])[0]
        shim = open_shim(shims[0])
        info = shim.info()
        c = make_case(seed, args.case, info.device_type, info.num_devices)
        print("mutations:", "; ".join(c.notes), "| verdict by the header:", c.verdict)
        print("outcome:", *run_case(shim, c))
        return 0
    seeds = args.seed or CI_SEEDS + [int.from_bytes(os.urandom(4), "little")]
    print(f"fuzzing {', '.join(shims)} with seeds {seeds} ({args.cases} cases each)", flush=True)
    table, compared, bad = {}, {}, 0
    for shim in shims:
        t0 = time.monotonic()
        counts, compared[shim] = fuzz(shim, seeds, args.cases, args.batch, args.timeout, args.verbose)
        table[shim] = dict(counts)
        bad += sum(counts[k] for k in BAD_CATEGORIES)
        line = ", ".join(f"{k} {counts[k]}" for k in CATEGORIES if counts[k])
        print(
            f"{shim}: {sum(counts.values())} cases in {time.monotonic() - t0:.0f} s: {line} "
            f"({compared[shim]} executed plans compared with the float64 reference)",
            flush=True,
        )
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"seeds": seeds, "cases": args.cases, "counts": table, "compared": compared}, indent=1)
        )
    if bad:
        print(f"FAIL: {bad} cases crashed, hung, or broke the header's rules (see the reproducers above)")
        return 1
    return 0


CI_SEEDS = [1, 2, 3]  # fixed, so that CI replays the same cases; main() adds one fresh seed

if __name__ == "__main__":
    sys.exit(main())

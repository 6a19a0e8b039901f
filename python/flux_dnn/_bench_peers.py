"""The peers of ``python -m flux_dnn bench``: what flux_dnn and the peer are each asked to
compute for one row, on the same inputs, and how their calls are timed.

Every peer gives ``case(op, layer, n, dtype, layout)``: {"flux": callable, "peer": callable
or None, "expected": callable returning the peer's result as a NumPy array}, and a timer
for _bench.interleaved (work queued on a GPU is waited for inside the timed call).
"""

from __future__ import annotations

import datetime
import platform

import numpy as np

import flux_dnn

from . import _bench
from ._bench_cli import DEVICES

# What each op is in torch's terms: the ops autograd calls (torch.ops.aten.convolution_backward
# with one output asked for), as benchmarks/bench_cpu.py times them.
_MASK = {"backward_data": [True, False, False], "backward_weight": [False, True, False]}


class _Peer:
    name = ""
    version = ""

    def __init__(self, device: str, algorithm: str):
        self.device, self.algorithm = device, algorithm
        self.options = {} if algorithm == "heuristic" else {"algorithm": algorithm}
        self.timer = _bench.time_once

    def shim_name(self, dtype: str) -> str:
        try:
            return _registry().shim_for(DEVICES[self.device], dtype).name
        except Exception:  # noqa: BLE001 -- the row's own call says why
            return "none"

    def device_text(self) -> str:
        return f"CPU: {_bench.cpu_text()}"

    def machine(self) -> dict:
        return dict(
            device=self.device,
            device_text=self.device_text(),
            cpu=_bench.cpu_info(),
            peer=self.name,
            peer_version=self.version,
            flux_dnn=flux_dnn.__version__,
            python=platform.python_version(),
            shims=_shims(self.device),
        )

    def header(self, args) -> list:
        date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
        what = f"{self.name} {self.version}" if self.name != "numpy" else "a NumPy float64 reference (no timing)"
        lines = [
            f"flux_dnn bench, {date}: flux_dnn {flux_dnn.__version__} vs {what} on {self.device}",
            f"machine: {self.device_text()}",
        ]
        lines += [f"shim: {s}" for s in _shim_lines(self.device, args.dtypes)]
        lines.append(
            f"N={args.batch}, {', '.join(args.layout)}, flux_dnn algorithm {self.algorithm}; "
            + (
                f"ratio = {self.name} ms / flux_dnn ms (above 1: flux_dnn faster), medians of interleaved calls"
                if self.name != "numpy"
                else "flux_dnn's results checked against float64, times are flux_dnn's alone"
            )
        )
        return lines

    @staticmethod
    def to_numpy(result):
        return np.asarray(result)


def _registry():
    from ._discovery import REGISTRY

    return REGISTRY


def _shims(device: str) -> list:
    return [
        dict(name=s.name, vendor=s.vendor, vendor_version=s.vendor_version_runtime, usable=s.usable)
        for s in flux_dnn.shims()
        if s.device_type == DEVICES[device]
    ]


def _shim_lines(device: str, dtypes) -> list:
    """Per dtype: the shim that serves it here, its vendor and version, the device as the
    shim names it (oneDNN: its ISA)."""
    statuses = {s.name: s for s in flux_dnn.shims() if s.device_type == DEVICES[device]}
    lines = []
    for dtype in dtypes:
        try:
            entry = _registry().shim_for(DEVICES[device], dtype)
        except Exception as exc:  # noqa: BLE001 -- said, and the rows fail with it
            lines.append(f"{dtype} -> none ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            continue
        s = statuses.get(entry.name)
        vendor = f"{s.vendor} {s.vendor_version_runtime}".strip() if s else "?"
        lines.append(f"{dtype} -> {entry.name} ({vendor}; {entry.device_info(0)['name']})")
    return lines


# ------------------------------------------------------------------------------------------
# torch


class TorchPeer(_Peer):
    name = "torch"

    def __init__(self, device: str, algorithm: str):
        super().__init__(device, algorithm)
        import torch

        self.torch, self.version = torch, torch.__version__
        self.tdevice = _torch_device(torch, device)
        sync = {
            "cuda": lambda: torch.cuda.synchronize(),
            "mps": lambda: torch.mps.synchronize(),
            "xpu": lambda: torch.xpu.synchronize(),
        }.get(self.tdevice)
        if sync is not None:
            self.timer = _bench.synced(sync)
            # torch's own search when flux_dnn benchmarks too, as benchmarks/bench_cuda.py does
            torch.backends.cudnn.benchmark = algorithm == "benchmark"

    def device_text(self) -> str:
        torch = self.torch
        if self.tdevice == "cuda":
            stack = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
            return f"GPU: {torch.cuda.get_device_name()} ({stack}); host {_bench.cpu_text()}"
        if self.tdevice == "mps":
            return f"GPU: Apple GPU through MPS, macOS {platform.mac_ver()[0]}; host {_bench.cpu_text()}"
        if self.tdevice == "xpu":
            return f"GPU: {torch.xpu.get_device_name()}; host {_bench.cpu_text()}"
        return f"CPU: {_bench.cpu_text()}; torch {torch.get_num_threads()} threads"

    def _tensors(self, shape, dtype, layout, gen, scale=1.0):
        torch = self.torch
        t = (torch.randn(*shape, generator=gen) * scale).to(device=self.tdevice, dtype=getattr(torch, dtype))
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        return t.contiguous(memory_format=fmt)

    def case(self, op, layer, n, dtype, layout) -> dict:
        torch, L = self.torch, layer
        gen = torch.Generator().manual_seed(0)
        ho = _bench.out_size(L.H, L.R, L.stride, L.pad)
        x = self._tensors((n, L.C, L.H, L.H), dtype, layout, gen)
        w = self._tensors((L.K, L.C // L.groups, L.R, L.R), dtype, layout, gen, 0.1)
        s, p, g, kw = L.stride, L.pad, L.groups, self.options
        if op == "forward":
            flux = lambda: flux_dnn.conv2d(x, w, None, s, p, 1, g, **kw)  # noqa: E731
            peer = lambda: torch.nn.functional.conv2d(x, w, None, s, p, 1, g)  # noqa: E731
        else:
            dy = self._tensors((n, L.K, ho, ho), dtype, layout, gen)
            aten = torch.ops.aten.convolution_backward
            mask = _MASK[op]
            peer = lambda: aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, mask)[mask.index(True)]  # noqa: E731
            if op == "backward_data":
                flux = lambda: flux_dnn.conv_backward_data(dy, w, tuple(x.shape), s, p, 1, g, **kw)  # noqa: E731
            else:
                flux = lambda: flux_dnn.conv_backward_weight(x, dy, tuple(w.shape), s, p, 1, g, **kw)  # noqa: E731
        return dict(flux=flux, peer=peer, expected=lambda: self.to_numpy(peer()))

    def to_numpy(self, result):
        return result.detach().to("cpu", self.torch.float64).numpy()


def _torch_device(torch, device: str) -> str:
    """torch's name for the --device, after checking that this torch can use it."""
    if device == "cpu":
        return "cpu"
    if device in ("cuda", "rocm"):
        hip = getattr(torch.version, "hip", None)
        if not torch.cuda.is_available() or (device == "rocm") != bool(hip):
            have = f"a {'ROCm' if hip else 'CUDA'} build" if torch.cuda.is_available() else "no GPU it can use"
            raise SystemExit(f"--device: {device!r} needs a torch for {device.upper()} with a GPU; torch has {have}")
        return "cuda"
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise SystemExit("--device: 'mps' needs torch on a Mac with MPS (torch.backends.mps.is_available())")
        return "mps"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise SystemExit(f"--device: {device!r} needs torch with an XPU device (torch.xpu.is_available())")
    return "xpu"


# ------------------------------------------------------------------------------------------
# JAX


class JaxPeer(_Peer):
    name = "jax"

    def __init__(self, device: str, algorithm: str):
        super().__init__(device, algorithm)
        import jax

        if device not in ("cpu", "cuda"):
            raise SystemExit(f"--device: {device!r} with the jax peer; allowed: cpu, cuda (flux_dnn.jax's platforms)")
        try:
            self.jdevice = jax.devices(device)[0]
        except RuntimeError as exc:
            raise SystemExit(f"--device: JAX has no {device!r} device here ({exc})") from None
        self.jax, self.version = jax, jax.__version__

    def device_text(self) -> str:
        if self.device == "cpu":
            return f"CPU: {_bench.cpu_text()}"
        return f"GPU: {self.jdevice.device_kind}; host {_bench.cpu_text()}"

    def case(self, op, layer, n, dtype, layout) -> dict:
        import flux_dnn.jax as fj

        jax, L = self.jax, layer
        if dtype == "float64" and not jax.config.jax_enable_x64:  # JAX would make float32 arrays
            raise ValueError("--dtypes: float64 with the jax peer needs JAX_ENABLE_X64=1 in the environment")
        jnp = jax.numpy
        rng = np.random.default_rng(0)
        nhwc = layout == "nhwc"
        dn = ("NHWC", "HWIO", "NHWC") if nhwc else ("NCHW", "OIHW", "NCHW")
        ho = _bench.out_size(L.H, L.R, L.stride, L.pad)

        def array(shape, perm, scale=1.0):
            a = (rng.standard_normal(shape) * scale).astype(np.float32).transpose(perm if nhwc else range(4))
            return jax.device_put(jnp.asarray(a, dtype=dtype), self.jdevice)

        x = array((n, L.C, L.H, L.H), (0, 2, 3, 1))
        w = array((L.K, L.C // L.groups, L.R, L.R), (2, 3, 1, 0), 0.1)
        dy = array((n, L.K, ho, ho), (0, 2, 3, 1))
        kw = dict(window_strides=(L.stride,) * 2, padding=((L.pad, L.pad),) * 2, dimension_numbers=dn,
                  feature_group_count=L.groups)  # fmt: skip
        convs = {
            "flux": lambda x, w: fj.conv_general_dilated(x, w, **kw, **self.options),
            "peer": lambda x, w: jax.lax.conv_general_dilated(x, w, **kw),
        }
        fns = {k: jax.jit(_op_of(jax, op, f)) for k, f in convs.items()}
        run = {k: (lambda f=f: jax.block_until_ready(f(x, w, dy))) for k, f in fns.items()}
        return dict(flux=run["flux"], peer=run["peer"], expected=lambda: self.to_numpy(run["peer"]()))

    @staticmethod
    def to_numpy(result):
        return np.asarray(result).astype(np.float64)


def _op_of(jax, op: str, conv):
    """f(x, w, dy) for the op: the forward, or the gradient in x or w of <conv(x, w), dy>."""
    if op == "forward":
        return lambda x, w, dy: conv(x, w)
    if op == "backward_data":
        return lambda x, w, dy: jax.vjp(lambda x: conv(x, w), x)[1](dy)[0]
    return lambda x, w, dy: jax.vjp(lambda w: conv(x, w), w)[1](dy)[0]


# ------------------------------------------------------------------------------------------
# NumPy: a float64 reference, for correctness only


class NumpyPeer(_Peer):
    name = "numpy"
    version = np.__version__

    def __init__(self, device: str, algorithm: str):
        super().__init__(device, algorithm)
        if device != "cpu":
            raise SystemExit(
                f"--device: {device!r} needs torch or JAX installed (NumPy arrays live on the CPU); allowed: cpu"
            )

    def case(self, op, layer, n, dtype, layout) -> dict:
        if dtype == "bfloat16":
            raise ValueError("--dtypes: NumPy has no bfloat16; install torch or jax to check it")
        L, rng = layer, np.random.default_rng(0)
        ho = _bench.out_size(L.H, L.R, L.stride, L.pad)

        def array(shape, scale=1.0):
            a = (rng.standard_normal(shape) * scale).astype(dtype)
            return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if layout == "nhwc" else a

        x, w = array((n, L.C, L.H, L.H)), array((L.K, L.C // L.groups, L.R, L.R), 0.1)
        dy = array((n, L.K, ho, ho))
        s, p, g, kw = L.stride, L.pad, L.groups, self.options
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        if op == "forward":
            flux = lambda: flux_dnn.conv2d(x, w, None, s, p, 1, g, **kw)  # noqa: E731
            expected = lambda: reference_forward(x64, w64, s, p, g)  # noqa: E731
        elif op == "backward_data":
            flux = lambda: flux_dnn.conv_backward_data(dy, w, x.shape, s, p, 1, g, **kw)  # noqa: E731
            expected = lambda: reference_backward_data(dy64, w64, x.shape, s, p, g)  # noqa: E731
        else:
            flux = lambda: flux_dnn.conv_backward_weight(x, dy, w.shape, s, p, 1, g, **kw)  # noqa: E731
            expected = lambda: reference_backward_weight(x64, dy64, w.shape, s, p, g)  # noqa: E731
        return dict(flux=flux, peer=None, expected=expected)


def _windows(x, r: int, s: int, p: int, g: int):
    """x (N, C, H, H) padded, as (N, g, C/g, Ho, Ho, R, R) windows at stride s."""
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(2, 3))[:, :, ::s, ::s]
    n, c = x.shape[:2]
    return win.reshape(n, g, c // g, *win.shape[2:])


def reference_forward(x, w, s, p, g):
    k, _, r, _ = w.shape
    y = np.einsum("ngchwrq,gkcrq->ngkhw", _windows(x, r, s, p, g), w.reshape(g, k // g, *w.shape[1:]), optimize=True)
    return y.reshape(x.shape[0], k, *y.shape[3:])


def reference_backward_data(dy, w, x_shape, s, p, g):
    """The adjoint of the forward: each kernel tap's contribution added at its strided rows."""
    n, c, h, _ = x_shape
    k, cg, r, _ = w.shape
    ho = dy.shape[2]
    dyg, wg = dy.reshape(n, g, k // g, ho, ho), w.reshape(g, k // g, cg, r, r)
    dxp = np.zeros((n, c, h + 2 * p, h + 2 * p))
    for i in range(r):
        for j in range(r):
            tap = np.einsum("ngkhw,gkc->ngchw", dyg, wg[..., i, j], optimize=True).reshape(n, c, ho, ho)
            dxp[:, :, i : i + s * (ho - 1) + 1 : s, j : j + s * (ho - 1) + 1 : s] += tap
    return dxp[:, :, p : p + h, p : p + h]


def reference_backward_weight(x, dy, w_shape, s, p, g):
    k, cg, r, _ = w_shape
    n, _, ho, _ = dy.shape
    dw = np.einsum("ngchwrq,ngkhw->gkcrq", _windows(x, r, s, p, g), dy.reshape(n, g, k // g, ho, ho), optimize=True)
    return dw.reshape(k, cg, r, r)


PEERS = {"torch": TorchPeer, "jax": JaxPeer, "numpy": NumpyPeer}


def make(name: str, device: str, algorithm: str) -> _Peer:
    return PEERS[name](device, algorithm)

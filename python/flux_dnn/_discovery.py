"""Finding and loading shims, and the order in which they are asked.

Shims register through the entry-point group ``flux_dnn.shims`` (the built-in oneDNN and
BLAS shims the same way as plugin wheels such as ``flux-dnn-cuda13``). Each entry point is a
zero-argument callable returning a :class:`ShimSpec`. Nothing is dlopened at ``import
flux_dnn``: the entry points are read on first need, and a shim is loaded on the first call
for its device. A shim that fails to load is recorded with its reason, which is raised (with
what to install) only when its device is asked for. ``FLUX_DNN_SHIMS=name[,name...]`` (or
paths to shim libraries) selects shims explicitly, in that order; then a shim that fails to
load fails loudly, at the first convolution. Listing (``flux_dnn.shims()``, ``python -m
flux_dnn info``) never raises: it shows every shim, with the reason of each failure.

Several shims may serve one device type (on the CPU: oneDNN, and the BLAS shim). They are
asked in the order of the priority each reports (Shim_Info), highest first, and a problem
goes to the first whose capabilities (Conv_Capabilities, as the shim finds this machine)
cover its dtype: what a vendor can do is never written down in Python.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.metadata
import os
import pathlib
import platform
import sys
import threading
from collections.abc import Callable

from . import _core

ENTRY_POINT_GROUP = "flux_dnn.shims"

DEVICE_NAMES = {
    _core.DEVICE_CPU: "CPU",
    _core.DEVICE_CUDA: "CUDA",
    _core.DEVICE_METAL: "Metal",
    _core.DEVICE_ROCM: "ROCm",
    _core.DEVICE_ONEAPI: "oneAPI",
}


def onednn_wheel_here() -> bool:
    """Whether oneDNN's wheel (onednn-cpu-gomp) exists for this platform: pyproject.toml's
    marker sys_platform == 'linux' and platform_machine == 'x86_64'. Elsewhere (Linux aarch64,
    macOS) the BLAS shim is the only CPU shim, and no hint may name oneDNN's wheel."""
    return sys.platform == "linux" and platform.machine() == "x86_64"


HINTS_GROUP = "flux_dnn.install_hints"
_hints: dict | None = None  # device type -> hint, read once from HINTS_GROUP


def install_hint(device_type: int) -> str:
    """What to install for a device type no installed shim serves: from the entry-point group
    ``flux_dnn.install_hints``, whose entry points each give a {DLPack device type: text}
    dict (or a zero-argument callable returning one). flux-dnn registers its own there; a
    plug-in package's entry overrides flux-dnn's for the device types it names. A broken
    entry point is skipped: a hint must never hide the error it decorates."""
    global _hints
    if _hints is None:
        found: dict = {}
        own: dict = {}
        for ep in importlib.metadata.entry_points(group=HINTS_GROUP):
            try:
                value = ep.load()
                given = dict(value() if callable(value) else value)
            except Exception:  # noqa: BLE001, S112 -- see above
                continue
            (own if ep.value.startswith("flux_dnn.") else found).update(given)
        _hints = {**own, **found}
    return _hints.get(device_type, "a flux_dnn shim package for that device")


def find_wheel_file(distribution: str, filename: str) -> pathlib.Path | None:
    """The file named `filename` among an installed distribution's files (its wheel's
    RECORD, through importlib.metadata), resolved to an absolute path; None when the
    distribution is not installed or holds no such file. Wherever pip put the wheel (a
    venv, --user, --prefix, --target), without LD_LIBRARY_PATH."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == filename:
            path = pathlib.Path(f.locate()).resolve()
            if path.exists():
                return path
    return None


def load_wheel_library(
    distribution: str, filename: str, mode: int = os.RTLD_LOCAL, *, fallback: str | None = None
) -> str:
    """Loads the shared library `filename` from an installed wheel by absolute path (see
    find_wheel_file), or, when the wheel does not hold it, `fallback` (a soname the dynamic
    loader's search may find: a system copy); returns what was loaded. OSError naming the
    distribution and the file when neither loads.

    mode: os.RTLD_LOCAL (the default) keeps the library's symbols out of the global scope:
    a shim that links it (DT_NEEDED by soname) still binds to it, because the loader
    matches an already-loaded object by soname whatever its mode, and a second library of
    the same soname loaded later by path (another vendor's build) cannot interpose its
    symbols. Use RTLD_GLOBAL only where the vendor library dlopens parts of itself that must
    see its symbols (cuDNN's engines).

    Loading order: a by-name lookup of a soname returns the FIRST object loaded with that
    soname; the registry therefore runs the CPU shims' preloads before it loads any other
    shim (Registry._try_load), so that the CPU shims' libraries are the ones their sonames
    resolve to."""
    path = find_wheel_file(distribution, filename)
    target = str(path) if path is not None else fallback
    if target is None:
        raise OSError(f"{filename} not found: the {distribution} wheel is not installed or holds no {filename}")
    try:
        ctypes.CDLL(target, mode=mode)
    except OSError as exc:
        where = f"from the {distribution} wheel" if path is not None else f"(not in the {distribution} wheel)"
        raise OSError(f"{filename} {where} failed to load: {exc}") from None
    return target


def device_name(device_type: int) -> str:
    return DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")


@dataclasses.dataclass(frozen=True)
class ShimSpec:
    """How to load one shim; returned by a ``flux_dnn.shims`` entry point. What the shim can
    do, and its priority among the shims of its device, it reports itself once loaded."""

    name: str  #: short name, e.g. "onednn"
    device_type: int  #: the DLPack device type it serves (CPU 1, CUDA 2, Metal 8, ROCm 10)
    library: str  #: absolute path of the shim's shared library
    #: loads the vendor libraries the shim links (e.g. by path from a vendor wheel); raises
    #: with a readable reason when they are missing
    preload: Callable[[], None] | None = None
    install_hint: str = ""  #: what to install when this shim cannot load
    #: What has been checked of this shim on its real vendor library and device, in words
    #: (``python -m flux_dnn info`` prints it). Text starting "never" marks it unverified:
    #: its first use in a process warns once (FLUX_DNN_UNVERIFIED_WARNING=0 silences it).
    verification: str = ""

    @property
    def verified(self) -> bool:
        return not self.verification.startswith("never")


#: The dtypes of the ABI, by the names array libraries give them.
DTYPES = ("float64", "float32", "float16", "bfloat16")
#: The convolution ops of the ABI by name.
OPS = {
    "forward": _core.CONV_FORWARD,
    "backward_data": _core.CONV_BACKWARD_DATA,
    "backward_weight": _core.CONV_BACKWARD_WEIGHT,
}
SUPPORT_WORDS = {_core.SUPPORT_NATIVE: "native", _core.SUPPORT_CONVERTED: "converted", _core.SUPPORT_NONE: "no"}


def flag_names(flags: int) -> str:
    """FDNN_CONV_* flag bits in words, e.g. "ALLOW_REDUCED_PRECISION"; "none" for 0."""
    names = [name for name in ("DETERMINISTIC", "ALLOW_REDUCED_PRECISION") if flags & getattr(_core, f"CONV_{name}")]
    rest = flags & ~(_core.CONV_DETERMINISTIC | _core.CONV_ALLOW_REDUCED_PRECISION)
    return " | ".join(names + ([hex(rest)] if rest else [])) or "none"


@dataclasses.dataclass
class ShimStatus:
    """What ``flux_dnn.shims()`` reports for one shim."""

    name: str
    device_type: int
    found: bool
    loaded: bool = False
    vendor: str = ""
    vendor_version_built: str = ""
    vendor_version_runtime: str = ""
    shim_version: str = ""  #: the flux_dnn version the shim was built from
    abi: tuple = ()  #: the ABI (major, minor) of the shim's table
    priority: int = 0  #: among shims of one device type the higher is asked first
    num_devices: int = 0
    device_name: str = ""  #: device 0's name as the shim gives it
    default_flags: int = 0  #: device 0's default CONV_* flags (TF32 on NVIDIA)
    path: str = ""
    #: the dtypes it computes forward on device 0 of this machine, as the shim reports them
    dtypes: tuple = ()
    #: dtype -> (how: "native", "converted" or "no", the shim's words), forward on device 0
    dtype_support: dict = dataclasses.field(default_factory=dict)
    #: op name ("forward", ...) -> dtype -> Shim.capabilities(), device 0 (usable shims only)
    capabilities: dict = dataclasses.field(default_factory=dict)
    reason: str | None = None  #: why it cannot be used here; None when usable
    install_hint: str = ""
    verification: str = ""  #: what was verified on the vendor's hardware (ShimSpec.verification)

    @property
    def usable(self) -> bool:
        return self.loaded and self.reason is None

    @property
    def device(self) -> str:
        return device_name(self.device_type) if self.device_type else "device unknown"


class _Entry:
    """One discovered shim: its spec (or the error that kept us from getting one), and once
    loaded what it reports of itself, asked once and remembered."""

    def __init__(self, name: str, spec: ShimSpec | None, reason: str | None, path: str = ""):
        self.name = name
        self.spec = spec
        self.path = spec.library if spec is not None else path  # the library, when known
        self.reason = reason  # why it failed to be found or loaded
        self.shim = None  # _core.Shim once loaded
        self.info: dict | None = None
        self.attempted = False
        self._capabilities: dict = {}  # (op, dtype, device_id) -> Shim.capabilities()
        self._devices: dict = {}  # device_id -> Shim.device_info()
        self.warned_unverified = False
        self.preloaded = False  # its spec's preload ran before another shim loaded

    @property
    def priority(self) -> int:
        return self.info["priority"] if self.info else 0

    @property
    def usable(self) -> bool:
        return self.shim is not None and self.reason is None and self.info["unavailable_reason"] is None

    def capabilities(self, op: int, dtype: str, device_id: int = 0) -> dict:
        """What the loaded shim computes for op and dtype on the device (Shim.capabilities)."""
        key = (op, dtype, device_id)
        if key not in self._capabilities:
            self._capabilities[key] = self.shim.capabilities(op, dtype, device_id)
        return self._capabilities[key]

    def device_info(self, device_id: int = 0) -> dict:
        """{"name", "default_flags"} of the device, as the loaded shim describes it."""
        if device_id not in self._devices:
            self._devices[device_id] = self.shim.device_info(device_id)
        return self._devices[device_id]

    def default_flags(self, device_id: int = 0) -> int:
        """The CONV_* flags a caller without a preference passes on this device."""
        return self.device_info(device_id)["default_flags"]

    def computes(self, dtype: str, device_id: int = 0, op: int | None = None) -> bool:
        """Whether the shim computes dtype on the device: for op, or for any op when None."""
        if dtype not in DTYPES:
            return False
        ops = OPS.values() if op is None else (op,)
        return any(self.capabilities(o, dtype, device_id)["support"] != _core.SUPPORT_NONE for o in ops)

    def why_not(self) -> str:
        return self.reason or (self.info or {}).get("unavailable_reason") or "unknown"


def _warn_if_unverified(entry: _Entry) -> None:
    """One UserWarning per process for a shim whose results were never checked on its
    vendor's hardware (its package says so in ShimSpec.verification), on its first use."""
    if entry.warned_unverified or entry.spec is None or entry.spec.verified:
        return
    entry.warned_unverified = True
    if os.environ.get("FLUX_DNN_UNVERIFIED_WARNING", "1") == "0":
        return
    import warnings

    warnings.warn(
        f"flux_dnn shim {entry.name!r} is unverified: {entry.spec.verification}; its results have not been checked on "
        "real hardware (FLUX_DNN_UNVERIFIED_WARNING=0 silences this warning)",
        UserWarning,
        stacklevel=4,
    )


class Registry:
    def __init__(self):
        self._lock = threading.RLock()
        self._entries: list | None = None
        self._explicit = False

    # -- discovery ---------------------------------------------------------------------
    def _discover(self) -> list:
        """The entries, in the order FLUX_DNN_SHIMS names them or the entry points list them.
        Never raises: what fails is recorded in the entry."""
        with self._lock:
            if self._entries is None:
                wanted = os.environ.get("FLUX_DNN_SHIMS", "").strip()
                self._explicit = bool(wanted)
                entries = self._from_entry_points()
                if wanted:
                    entries = self._select(entries, [w.strip() for w in wanted.split(",") if w.strip()])
                self._entries = entries
            return self._entries

    @staticmethod
    def _from_entry_points() -> list:
        entries = []
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                spec = ep.load()()
                if not isinstance(spec, ShimSpec):
                    raise TypeError(f"entry point returned {type(spec).__name__}, not ShimSpec")
                entries.append(_Entry(spec.name, spec, None))
            except Exception as exc:  # a broken plugin must not break import or other shims
                entries.append(_Entry(ep.name, None, f"entry point {ep.value!r} failed: {exc}"))
        return entries

    @staticmethod
    def _select(entries: list, wanted: list) -> list:
        by_name = {e.name: e for e in entries}
        chosen = []
        for item in wanted:
            if item in by_name:
                chosen.append(by_name[item])
            elif os.sep in item or item.endswith((".so", ".dylib", ".dll")):
                chosen.append(_Entry(item, None, None, path=item))  # a library path, described at load
            else:
                known = ", ".join(sorted(by_name)) or "none"
                chosen.append(
                    _Entry(
                        item, None, f"FLUX_DNN_SHIMS names {item!r}, but no such shim is installed (installed: {known})"
                    )
                )
        return chosen

    # -- loading -----------------------------------------------------------------------
    def _load(self, entry: _Entry) -> None:
        """Loads an entry once; a failure is recorded in entry.reason, never raised. Before
        any shim that is not a CPU shim (or whose device is not known before loading), the
        CPU shims' preloads run (_preload_cpu_shims)."""
        if entry.attempted:
            return
        entry.attempted = True
        if entry.reason is None:
            if entry.spec is None or entry.spec.device_type != _core.DEVICE_CPU:
                self._preload_cpu_shims()
            self._try_load(entry)

    def _preload_cpu_shims(self) -> None:
        """Runs the preloads of the CPU shims, once, before another shim loads.

        The rule a plug-in can rely on: the CPU shims' vendor libraries are loaded before any
        other shim's. It matters where two vendor libraries share a soname (oneDNN 3.2 for the
        CPU shim and a SYCL build of oneDNN are both libdnnl.so.3): a by-name lookup of a
        soname, such as the CPU shim's DT_NEEDED, returns the FIRST object loaded with it, so
        the CPU shim's oneDNN must come first. A plug-in whose library shares a soname with a
        CPU shim's must load it by path and bind to it through that handle (dlopen + dlsym,
        or dlmopen), never through its own DT_NEEDED by soname. A preload that fails here is
        ignored: the CPU shim's own load records the reason."""
        for cpu in self._discover():
            if cpu.spec is None or cpu.spec.device_type != _core.DEVICE_CPU or cpu.preloaded:
                continue
            cpu.preloaded = True
            if cpu.spec.preload is not None:
                try:
                    cpu.spec.preload()
                except Exception:  # noqa: BLE001, S110 -- see above
                    pass

    @staticmethod
    def _try_load(entry: _Entry) -> None:
        try:
            if entry.spec is not None and entry.spec.preload is not None:
                entry.spec.preload()
            path = entry.spec.library if entry.spec is not None else entry.path
            entry.shim = _core.load_shim(os.fspath(path))
            entry.info = entry.shim.info()
            if entry.spec is None:  # loaded from a bare path: the library describes itself
                entry.spec = ShimSpec(entry.info["name"], entry.info["device_type"], path)
                entry.name = entry.spec.name
        except Exception as exc:  # noqa: BLE001 -- any failure is the entry's reason
            entry.shim = None
            entry.info = None
            entry.reason = f"{type(exc).__name__}: {exc}"

    def _check_explicit(self) -> None:
        """A shim named in FLUX_DNN_SHIMS that fails to load fails the first convolution."""
        for entry in self._discover():
            self._load(entry)
            if entry.reason is not None:
                raise _core.ShimLoadError(f"shim {entry.name!r} named in FLUX_DNN_SHIMS failed to load: {entry.reason}")

    def usable_for(self, device_type: int, loud: bool = True) -> tuple:
        """(the loaded, usable shims for a device type, in the order they are asked; the
        entries that failed, maybe for this device). The order is FLUX_DNN_SHIMS's when it
        is set, else each shim's reported priority, highest first (ties keep the entry
        points' order). loud: raise ShimLoadError when a shim named in FLUX_DNN_SHIMS fails
        to load (dispatch); listing passes False."""
        with self._lock:
            entries = self._discover()
            if self._explicit and loud:
                self._check_explicit()
            usable, failures = [], []
            for entry in entries:
                if entry.spec is None and entry.reason is None:
                    self._load(entry)  # a bare library path: loading tells its device
                if entry.spec is None:
                    failures.append(entry)  # a broken entry point, maybe for this device
                    continue
                if entry.spec.device_type != device_type:
                    continue
                self._load(entry)
                (usable if entry.usable else failures).append(entry)
            if not self._explicit:
                usable.sort(key=lambda e: -e.priority)  # stable
            return usable, failures

    def candidates(
        self, device_type: int, dtype: str, device_id: int = 0, argument: str = "x", op: int | None = None
    ) -> list:
        """The usable shims for a device type that compute `dtype` on device_id (for `op`, or
        for any op when None), as their capabilities report, in the order they are asked.
        A caller tries them in turn, passing a problem on when plan creation raises
        UnsupportedError. Raises DeviceUnavailableError when no shim for the device works
        here, TypeError naming `argument` and what each shim computes when none computes
        the dtype, ShimLoadError when a shim named in FLUX_DNN_SHIMS failed to load."""
        usable, failures = self.usable_for(device_type)
        if not usable:
            raise _core.DeviceUnavailableError(self._unavailable_message(device_type, failures))
        serving = [entry for entry in usable if entry.computes(dtype, device_id, op)]
        if not serving:
            raise TypeError(self._dtype_message(device_type, dtype, device_id, argument, usable, failures, op))
        _warn_if_unverified(serving[0])
        return serving

    def shim_for(
        self,
        device_type: int,
        dtype: str | None = None,
        device_id: int = 0,
        argument: str = "x",
        op: int | None = None,
    ) -> _Entry:
        """The first of candidates() (the first usable shim when dtype is None)."""
        if dtype is None:
            usable, failures = self.usable_for(device_type)
            if not usable:
                raise _core.DeviceUnavailableError(self._unavailable_message(device_type, failures))
            return usable[0]
        return self.candidates(device_type, dtype, device_id, argument, op)[0]

    @staticmethod
    def _dtype_message(device_type, dtype, device_id, argument, usable, failures, op) -> str:
        device = device_name(device_type)
        lines = [f"{argument}: dtype {dtype} is not supported by any shim for {device} arrays here:"]
        for e in usable:
            takes = [d for d in DTYPES if e.computes(d, device_id, op)]
            why = e.capabilities(op or _core.CONV_FORWARD, dtype, device_id)["detail"] if dtype in DTYPES else ""
            lines.append(f"  shim {e.name!r} computes {', '.join(takes) or 'nothing'}" + (f" ({why})" if why else ""))
        for e in failures:
            lines.append(f"  shim {e.name!r} is not usable: {e.why_not()}")
        lines.append(f"  accepted dtypes: {', '.join(DTYPES)}")
        return "\n".join(lines)

    @staticmethod
    def _unavailable_message(device_type: int, failures: list) -> str:
        device = device_name(device_type)
        hint = install_hint(device_type)
        if not failures:
            return (
                f"no flux_dnn shim is installed for {device} arrays (DLPack device type {device_type}); "
                f"to add one: {hint}"
            )
        lines = [f"no usable flux_dnn shim for {device} arrays (DLPack device type {device_type}):"]
        hints = []  # each failed shim's own hint, once (two plug-ins for one device: both)
        for e in failures:
            lines.append(f"  shim {e.name!r}: {e.why_not()}")
            if e.spec and e.spec.install_hint and e.spec.install_hint not in hints:
                hints.append(e.spec.install_hint)
        lines.append(f"  to fix: {'; or: '.join(hints) or hint}")
        return "\n".join(lines)

    def statuses(self, load: bool = True) -> list:
        """A ShimStatus per entry, in discovery order. Never raises."""
        with self._lock:
            result = []
            for e in self._discover():
                if load:
                    self._load(e)
                result.append(self._status(e))
            return result

    @staticmethod
    def _status(e: _Entry) -> ShimStatus:
        spec, info = e.spec, e.info or {}
        status = ShimStatus(
            name=e.name,
            device_type=spec.device_type if spec else info.get("device_type", 0),
            found=spec is not None or e.shim is not None,
            loaded=e.shim is not None,
            vendor=info.get("vendor", ""),
            vendor_version_built=info.get("vendor_version_built", ""),
            vendor_version_runtime=info.get("vendor_version_runtime", ""),
            shim_version=info.get("shim_version", ""),
            abi=tuple(info.get("abi", ())),
            priority=info.get("priority", 0),
            num_devices=info.get("num_devices", 0),
            path=info.get("path", e.path),
            reason=e.reason or info.get("unavailable_reason"),
            install_hint=spec.install_hint if spec else "",
            verification=spec.verification if spec else "",
        )
        if not e.usable:
            return status
        try:  # a shim that fails to describe device 0 is listed with that reason
            device = e.device_info(0)
            status.device_name, status.default_flags = device["name"], device["default_flags"]
            status.capabilities = {name: {d: e.capabilities(op, d) for d in DTYPES} for name, op in OPS.items()}
        except Exception as exc:  # noqa: BLE001
            status.reason = f"{type(exc).__name__}: {exc}"
            return status
        forward = status.capabilities["forward"]
        status.dtype_support = {
            d: (SUPPORT_WORDS.get(c["support"], f"unknown ({c['support']})"), c["detail"]) for d, c in forward.items()
        }
        status.dtypes = tuple(d for d, c in forward.items() if c["support"] != _core.SUPPORT_NONE)
        return status

    def reset(self) -> None:
        """Forget discovery (tests; after installing a plugin). Loaded libraries stay loaded."""
        with self._lock:
            self._entries = None


REGISTRY = Registry()


def shims(load: bool = True) -> list:
    """Every shim flux_dnn knows of, with whether it loaded, its vendor version and devices,
    or why it cannot be used. ``load=False`` lists without loading any library."""
    return REGISTRY.statuses(load=load)

"""Finding and loading shims.

Shims register through the entry-point group ``flux_dnn.shims`` (the built-in oneDNN shim the
same way as plugin wheels such as ``flux-dnn-cuda13``). Each entry point is a zero-argument
callable returning a :class:`ShimSpec`. Nothing is dlopened at ``import flux_dnn``: the entry
points are read on first need, and a shim is loaded on the first call for its device. A shim
that fails to load is recorded with its reason, which is raised (with what to install) only
when its device is asked for. ``FLUX_DNN_SHIMS=name[,name...]`` (or paths to shim libraries)
selects shims explicitly; then a shim that fails to load fails loudly, at first use.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import threading
from typing import Callable, Optional

from . import _core

ENTRY_POINT_GROUP = "flux_dnn.shims"

DEVICE_NAMES = {1: "CPU", 2: "CUDA", 8: "Metal", 10: "ROCm", 14: "oneAPI"}

# What a user installs to get a shim for a device type.
INSTALL_HINTS = {
    1: "pip install flux-dnn (its oneDNN CPU shim needs the onednn-cpu-gomp wheel)",
    2: "pip install flux-dnn-cuda13 (or flux-dnn-cuda12 for CUDA 12)",
    8: "pip install flux-dnn on macOS (the MPS shim is built there)",
    10: "pip install flux-dnn-rocm",
}


def device_name(device_type: int) -> str:
    return DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")


@dataclasses.dataclass(frozen=True)
class ShimSpec:
    """How to load one shim; returned by a ``flux_dnn.shims`` entry point."""

    name: str  #: short name, e.g. "onednn"
    device_type: int  #: the DLPack device type it serves (CPU 1, CUDA 2, Metal 8, ROCm 10)
    library: str  #: absolute path of the shim's shared library
    #: dtypes it computes in, as names ("float32", "bfloat16", "float16", "float64")
    dtypes: tuple = ("float32",)
    #: loads the vendor libraries the shim links (e.g. by path from a vendor wheel); raises
    #: with a readable reason when they are missing
    preload: Optional[Callable[[], None]] = None
    install_hint: str = ""  #: what to install when this shim cannot load
    priority: int = 0  #: among shims of one device type, higher is tried first


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
    num_devices: int = 0
    path: str = ""
    dtypes: tuple = ()
    reason: Optional[str] = None  #: why it cannot be used here; None when usable
    install_hint: str = ""

    @property
    def usable(self) -> bool:
        return self.loaded and self.reason is None

    @property
    def device(self) -> str:
        return device_name(self.device_type)


class _Entry:
    """One discovered shim: its spec (or the error that kept us from getting one)."""

    def __init__(self, name: str, spec: Optional[ShimSpec], reason: Optional[str]):
        self.name = name
        self.spec = spec
        self.reason = reason  # why it failed to be found or loaded
        self.shim = None  # _core.Shim once loaded
        self.info: Optional[dict] = None
        self.attempted = False


class Registry:
    def __init__(self):
        self._lock = threading.RLock()
        self._entries: Optional[list] = None
        self._explicit = False

    # -- discovery ---------------------------------------------------------------------
    def _discover(self) -> list:
        with self._lock:
            if self._entries is None:
                wanted = os.environ.get("FLUX_DNN_SHIMS", "").strip()
                self._explicit = bool(wanted)
                entries = self._from_entry_points()
                if wanted:
                    entries = self._select(entries, [w.strip() for w in wanted.split(",") if w.strip()])
                self._entries = entries
                if self._explicit:  # named shims load now, and a failure is loud
                    for entry in entries:
                        self._load(entry)
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
                chosen.append(_Entry(item, None, None))  # a library path, described at load
            else:
                known = ", ".join(sorted(by_name)) or "none"
                chosen.append(_Entry(item, None, f"FLUX_DNN_SHIMS names {item!r}, but no such shim is installed (installed: {known})"))
        return chosen

    # -- loading -----------------------------------------------------------------------
    def _load(self, entry: _Entry) -> None:
        if entry.attempted:
            return
        entry.attempted = True
        if entry.reason is None:
            self._try_load(entry)
        if entry.reason is not None and self._explicit:
            raise _core.ShimLoadError(f"shim {entry.name!r} named in FLUX_DNN_SHIMS failed to load: {entry.reason}")

    @staticmethod
    def _try_load(entry: _Entry) -> None:
        try:
            if entry.spec is not None and entry.spec.preload is not None:
                entry.spec.preload()
            path = entry.spec.library if entry.spec is not None else entry.name
            entry.shim = _core.load_shim(os.fspath(path))
            entry.info = entry.shim.info()
            if entry.spec is None:  # loaded from a bare path: the library describes itself
                entry.spec = ShimSpec(entry.info["name"], entry.info["device_type"], path)
                entry.name = entry.spec.name
        except Exception as exc:
            entry.shim = None
            entry.reason = f"{type(exc).__name__}: {exc}"

    def shim_for(self, device_type: int) -> _Entry:
        """The loaded, usable shim for a device type; raises DeviceUnavailableError."""
        with self._lock:
            failures = []
            for entry in self._discover():
                if entry.spec is None and entry.reason is None:
                    self._load(entry)  # a bare library path: loading tells its device
                if entry.spec is None:
                    failures.append(entry)  # a broken entry point, maybe for this device
                    continue
                if entry.spec.device_type != device_type:
                    continue
                self._load(entry)
                if entry.shim is not None and entry.info["unavailable_reason"] is None:
                    return entry
                failures.append(entry)
            raise _core.DeviceUnavailableError(self._unavailable_message(device_type, failures))

    @staticmethod
    def _unavailable_message(device_type: int, failures: list) -> str:
        device = device_name(device_type)
        hint = INSTALL_HINTS.get(device_type, "a flux_dnn shim package for that device")
        if not failures:
            return f"no flux_dnn shim is installed for {device} arrays (DLPack device type {device_type}); to add one: {hint}"
        lines = [f"no usable flux_dnn shim for {device} arrays (DLPack device type {device_type}):"]
        for e in failures:
            why = e.reason or (e.info or {}).get("unavailable_reason") or "unknown"
            lines.append(f"  shim {e.name!r}: {why}")
            hint = (e.spec.install_hint if e.spec and e.spec.install_hint else hint)
        lines.append(f"  to fix: {hint}")
        return "\n".join(lines)

    def statuses(self, load: bool = True) -> list:
        with self._lock:
            result = []
            for e in self._discover():
                if load:
                    try:
                        self._load(e)
                    except _core.ShimLoadError:
                        pass  # recorded in e.reason; listing must show every shim
                spec, info = e.spec, e.info or {}
                reason = e.reason or info.get("unavailable_reason")
                result.append(ShimStatus(
                    name=e.name, device_type=spec.device_type if spec else info.get("device_type", 0),
                    found=spec is not None or e.shim is not None, loaded=e.shim is not None,
                    vendor=info.get("vendor", ""),
                    vendor_version_built=info.get("vendor_version_built", ""),
                    vendor_version_runtime=info.get("vendor_version_runtime", ""),
                    num_devices=info.get("num_devices", 0), path=info.get("path", spec.library if spec else ""),
                    dtypes=tuple(spec.dtypes) if spec else (), reason=reason,
                    install_hint=spec.install_hint if spec else ""))
            return result

    def reset(self) -> None:
        """Forget discovery (tests; after installing a plugin). Loaded libraries stay loaded."""
        with self._lock:
            self._entries = None


REGISTRY = Registry()


def shims(load: bool = True) -> list:
    """Every shim flux_dnn knows of, with whether it loaded, its vendor version and devices,
    or why it cannot be used. ``load=False`` lists without loading any library."""
    return REGISTRY.statuses(load=load)

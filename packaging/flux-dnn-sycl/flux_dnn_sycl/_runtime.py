"""Finding and loading Intel's SYCL stack for the onednn_sycl shim, with no environment
variable set by the user and no LD_LIBRARY_PATH. No flux_dnn import here: the ABI suite and
the CI script use it on their own.

What the runtime needs, and why it is done here:

- **The OpenCL CPU device.** intel-opencl-rt installs ``etc/OpenCL/vendors/intel-cpu.icd``, but
  that file holds a placeholder path of Intel's build machine (``/opt/anaconda1anaconda2
  anaconda3/lib/libintelocl.so``), so the OpenCL ICD loader finds no CPU runtime through it.
  The loader also reads ``OCL_ICD_FILENAMES`` (a list of ICD libraries to load): set to the
  wheel's own ``libintelocl.so`` it lists the CPU, and SYCL's OpenCL adapter (intel-cmplr-lib-ur
  2025.3, ``libur_adapter_opencl.so``) shows it as ``opencl:cpu``. The loader reads the variable
  once, when it first enumerates platforms, which the SYCL runtime does the first time anyone
  lists devices (``dpctl.get_devices()``, a first dpnp array, a first SYCL queue), not at
  ``import dpctl``. The wheel's start-up hook (``flux_dnn_sycl.pth``, run by ``site`` when
  Python starts) sets it before anything can list devices; :func:`configure_opencl`, run when
  flux_dnn_sycl is imported, does the same for interpreters started without ``site``
  (``python -S``), which is early enough only if no SYCL device was listed before in the
  process: otherwise the CPU device stays invisible for the life of the process, and the
  shim's reason (``python -m flux_dnn info``) says what to do.
  A value the user set is kept (extended with the wheel's runtime, never replaced).
- **oneDNN by path.** The SYCL oneDNN (``onednn`` 2025.3.0: oneDNN 3.9) and the CPU shim's
  oneDNN 3.2 (``onednn-cpu-gomp``) both install ``<prefix>/lib/libdnnl.so.3``; whichever wheel
  was installed last owns that file. Each wheel's versioned file (``libdnnl.so.3.9``,
  ``libdnnl.so.3.2``) is its own, so the shim is pointed at ``libdnnl.so.3.N`` of the ``onednn``
  wheel's file list (``FLUX_DNN_ONEDNN_SYCL_LIBDNNL``), which it opens by path with
  RTLD_LOCAL | RTLD_DEEPBIND (csrc/shims/onednn_sycl/sycl_lib.hpp).
- **Its dependencies by path.** libdnnl.so.3.9 has no run path: libsycl.so.8, libtbb.so.12,
  libOpenCL.so.1 and the compiler runtime (libsvml, libimf, libintlc, libirng) are loaded from
  their wheels by path first (RTLD_GLOBAL, as dpctl loads them), so the by-name lookups of
  libdnnl.so.3.9 find them loaded.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import pathlib
import re

#: The wheels, the libraries each brings that the shim's oneDNN needs, in load order.
DEPENDENCIES = (
    ("tbb", "libtbb.so.12"),
    ("intel-cmplr-lib-rt", "libintlc.so.5"),
    ("intel-cmplr-lib-rt", "libirng.so"),
    ("intel-cmplr-lib-rt", "libimf.so"),
    ("intel-cmplr-lib-rt", "libsvml.so"),
    ("intel-opencl-rt", "libOpenCL.so.1"),
    ("intel-cmplr-lib-ur", "libur_loader.so.0"),
    ("intel-sycl-rt", "libsycl.so.8"),
)
ONEDNN_DIST = "onednn"
OPENCL_DIST = "intel-opencl-rt"
ADAPTER_DIST = "intel-cmplr-lib-ur"
_ENV_DNNL = "FLUX_DNN_ONEDNN_SYCL_LIBDNNL"

_state: dict = {}


def wheel_file(dist: str, pattern: str) -> pathlib.Path | None:
    """The file of distribution `dist` whose name matches the regular expression `pattern`
    (the most specific name when several do), or None."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    hits = [f for f in files if re.fullmatch(pattern, f.name)]
    for f in sorted(hits, key=lambda f: len(f.name), reverse=True):
        path = pathlib.Path(f.locate()).resolve()
        if path.exists():
            return path
    return None


def libdnnl() -> pathlib.Path | None:
    """libdnnl.so.3.N of the onednn (SYCL) wheel: the versioned file, never the libdnnl.so.3
    alias that onednn-cpu-gomp also installs."""
    return wheel_file(ONEDNN_DIST, r"libdnnl\.so\.3\.\d+")


def libintelocl() -> pathlib.Path | None:
    """The wheel's OpenCL CPU runtime, by the name the start-up hook uses (libintelocl.so; the
    wheel also ships a copy as libintelocl.so.<version>, and naming both would make the ICD
    loader load the runtime twice: two CPU devices)."""
    return wheel_file(OPENCL_DIST, r"libintelocl\.so")


def _same_runtime(entry: str, lib: pathlib.Path) -> bool:
    """Whether an OCL_ICD_FILENAMES entry is this runtime under any of its names."""
    e = pathlib.Path(entry)
    return e.parent.resolve() == lib.parent and e.name.startswith("libintelocl.so")


def has_opencl_adapter() -> bool:
    """Whether the SYCL runtime has its OpenCL adapter (intel-cmplr-lib-ur 2025.3 has it; the
    2026.x wheels ship only Level Zero adapters)."""
    return wheel_file(ADAPTER_DIST, r"libur_adapter_opencl\.so(\.[\d.]+)?") is not None


def configure_opencl() -> None:
    """Points the OpenCL ICD loader at the wheel's CPU runtime (OCL_ICD_FILENAMES), once."""
    if "opencl" in _state:
        return
    lib = libintelocl()
    note = ""
    if lib is None:
        note = "no OpenCL CPU runtime (pip install flux-dnn-sycl[cpu] for the CPU as a SYCL device)"
    else:
        current = os.environ.get("OCL_ICD_FILENAMES", "")
        entries = [e for e in current.split(":") if e]
        if not any(_same_runtime(e, lib) for e in entries):
            os.environ["OCL_ICD_FILENAMES"] = ":".join([*entries, str(lib)])
        if not has_opencl_adapter():
            note = (
                "the SYCL runtime has no OpenCL adapter (libur_adapter_opencl.so): pip install "
                "intel-cmplr-lib-ur==2025.3.3 (the 2026 wheels ship Level Zero adapters only)"
            )
    _state["opencl"] = (lib, note)


def preload() -> None:
    """Loads the shim's vendor libraries by path, and tells the shim where oneDNN is. Raises
    OSError naming what is missing."""
    if _state.get("loaded"):
        return
    configure_opencl()
    dnnl = libdnnl()
    if dnnl is None:
        raise OSError(
            "oneDNN with the SYCL runtime (libdnnl.so.3.N of the onednn wheel) is not installed: "
            "pip install onednn==2025.3.0"
        )
    for dist, name in DEPENDENCIES:
        path = wheel_file(dist, re.escape(name) + r"(\.[\d.]+)?")
        if path is None:
            if dist == "intel-opencl-rt":
                continue  # the [cpu] extra: without it, Intel GPUs only (a system OpenCL may do)
            try:  # a system copy the dynamic loader can find (an oneAPI install) does too
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
                continue
            except OSError:
                raise OSError(f"{name} (wheel {dist}) is not installed: pip install {dist}") from None
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    os.environ.setdefault(_ENV_DNNL, str(dnnl))
    note = _state["opencl"][1]
    if note:  # the shim adds it to its reason when the SYCL runtime lists no device
        os.environ["FLUX_DNN_ONEDNN_SYCL_NOTE"] = note
    _state["loaded"] = True

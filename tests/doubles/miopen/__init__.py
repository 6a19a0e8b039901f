"""The MIOpen test double: libMIOpen.so.1 and a HIP runtime (libamdhip64.so.6) on host memory,
built from the C++ sources here with the system C++ compiler (see miopen_double.cpp for the
contracts it enforces). It checks the MIOpen shim's plumbing, never that it works on AMD GPUs.

use(directory) builds both once and makes the MIOpen shim load them: it preloads the double's
libMIOpen.so.1 (which brings its HIP runtime) with RTLD_GLOBAL, and sets
FLUX_DNN_MIOPEN_LIBRARY to it, before any shim is loaded. Tests on an AMD machine set
FLUX_DNN_MIOPEN_REAL=1 and the double stays out of the way."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
INCLUDES = [ROOT / "csrc" / "shims" / "miopen", ROOT / "csrc" / "shims" / "common"]


def wanted() -> bool:
    """Whether this process should run the MIOpen shim on the double (not on a real MIOpen)."""
    return os.environ.get("FLUX_DNN_MIOPEN_REAL", "") != "1"


def build(directory: os.PathLike) -> pathlib.Path:
    """Builds the double into directory (once); returns the path of its libMIOpen.so.1."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    miopen = out / "libMIOpen.so.1"
    if miopen.exists():
        return miopen
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler here to build the MIOpen test double")
    flags = ["-std=c++17", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]
    flags += [f"-I{d}" for d in INCLUDES]
    hip = out / "libamdhip64.so.6"
    subprocess.run(
        [cxx, *flags, str(HERE / "hip_double.cpp"), "-Wl,-soname,libamdhip64.so.6", "-o", str(hip)], check=True
    )
    tmp = out / "libMIOpen.so.1.tmp"
    subprocess.run(
        [
            cxx,
            *flags,
            str(HERE / "miopen_double.cpp"),
            "-Wl,-soname,libMIOpen.so.1",
            # MIOpen links its HIP runtime; the double uses none of it, so keep the link anyway
            "-Wl,--no-as-needed",
            str(hip),
            "-Wl,-rpath,$ORIGIN",
            "-o",
            str(tmp),
        ],
        check=True,
    )
    tmp.rename(miopen)  # atomic: a concurrent build never sees half a library
    return miopen


def build_or_skip(directory: os.PathLike) -> pathlib.Path:
    """build(), or skips the calling test when this machine cannot build the double (no C++
    compiler: e.g. the compiler-free venv in which .ci/wheels.sh tests the installed wheels)."""
    import pytest

    try:
        return build(directory)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the MIOpen test double could not be built here: {exc}")


def use(directory: os.PathLike) -> pathlib.Path:
    """Builds the double and makes it the MIOpen (and HIP runtime) of this process."""
    path = build(directory)
    os.environ["FLUX_DNN_MIOPEN_LIBRARY"] = str(path)
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return path

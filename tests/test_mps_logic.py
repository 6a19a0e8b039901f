"""The MPS shim's platform-independent decisions (csrc/shims/mps/mps_problem.*), built here
with the host C++ compiler into tests/mps_logic/test_mps_logic.cpp and run: capabilities
per macOS version, the refusals of problems MPSGraph gets wrong, when a 16-bit convolution
runs in float32, 1-D as 2-D, padding per side, layouts, gather indices of gapped tensors,
bindings, the 4 GiB MPSNDArray limit, the Metal device choice and staging sizes. The
Objective-C++ part of the shim is checked by .ci/mps.sh (syntax only) and by
scripts/mac_check.sh on a Mac."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [
    ROOT / "tests/mps_logic/test_mps_logic.cpp",
    ROOT / "csrc/shims/mps/mps_problem.cpp",
    ROOT / "csrc/shims/common/shim_common.cpp",
]


def test_mps_decisions(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler here to build tests/mps_logic/test_mps_logic.cpp")
    if not all(s.exists() for s in SOURCES):
        pytest.skip("not a source checkout (csrc/ is not next to tests/)")
    exe = tmp_path / "test_mps_logic"
    includes = [f"-I{ROOT / d}" for d in ("csrc/include", "csrc/shims/common", "csrc/shims/mps")]
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            *includes,
            *map(str, SOURCES),
            "-o",
            str(exe),
            "-pthread",
        ],
        check=True,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failed" in run.stdout

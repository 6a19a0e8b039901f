"""What `python -m flux_dnn info` and `demo` say is true on the platform they run on (issue 24):
the oneDNN shim's install hint names oneDNN's wheel only where that wheel exists (Linux
x86-64), and the demo names the shim that served its call. Runs on Linux aarch64 too
(.ci/aarch64.sh), where the BLAS shim is the only CPU shim."""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _discovery, _onednn
from flux_dnn._discovery import REGISTRY


@pytest.mark.parametrize(
    "system, machine, expected",
    [("linux", "x86_64", True), ("linux", "aarch64", False), ("darwin", "arm64", False), ("darwin", "x86_64", False)],
)
def test_onednn_wheel_here_follows_the_dependency_marker(monkeypatch, system, machine, expected):
    # pyproject.toml: onednn-cpu-gomp; sys_platform == 'linux' and platform_machine == 'x86_64'
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert _discovery.onednn_wheel_here() is expected


def test_onednn_hint_names_its_wheel_only_where_it_helps():
    # built, oneDNN's library missing (x86-64): its wheel is the fix
    assert "onednn-cpu-gomp" in _onednn.install_hint(built=True, wheel_here=True)
    # not built, on x86-64: oneDNN's wheel alone would not bring the shim
    not_built = _onednn.install_hint(built=False, wheel_here=True)
    assert "onednn-cpu-gomp" not in not_built and "FLUX_DNN_BUILD_ONEDNN" in not_built
    # a platform without oneDNN's wheel: nothing to install, and the reason says why
    assert _onednn.install_hint(built=False, wheel_here=False) == ""
    assert "Linux x86-64 only" in _onednn._why_not_built(False) and "BLAS shim" in _onednn._why_not_built(False)


def test_info_tells_what_is_true_of_onednn_here():
    run = subprocess.run([sys.executable, "-m", "flux_dnn", "info"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    block = run.stdout.split("shim onednn [CPU]: ", 1)[1].split("\n\n", 1)[0]
    onednn = {s.name: s for s in flux_dnn.shims()}["onednn"]
    if not _discovery.onednn_wheel_here():  # Linux aarch64, macOS
        assert "onednn-cpu-gomp==" not in run.stdout and "to fix:" not in block
        assert "exists for Linux x86-64 only" in block
    elif onednn.usable:
        assert block.startswith("usable")
    else:  # x86-64, a build without the shim or without oneDNN's wheel: the fix for the case
        built = os.path.exists(onednn.path)
        assert f"to fix:   {_onednn.install_hint(built, True)}" in block


@pytest.mark.parametrize("pinned", [None, "blas"])
def test_demo_names_the_shim_that_served_it(pinned):
    env = dict(os.environ)
    env.pop("FLUX_DNN_SHIMS", None)
    if pinned:
        env["FLUX_DNN_SHIMS"] = pinned
    run = subprocess.run(
        [sys.executable, "-m", "flux_dnn", "demo"], capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    expected = pinned or REGISTRY.shim_for(1, "float32").name
    vendor = {s.name: s.vendor for s in flux_dnn.shims()}[expected]
    assert f" via the {expected} shim ({vendor} " in run.stdout, run.stdout
    assert "via  " not in run.stdout


def test_a_plan_names_its_shim():
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64"):
        x = rng.standard_normal((1, 3, 6, 6)).astype(dtype)
        w = rng.standard_normal((4, 3, 3, 3)).astype(dtype)
        plan = flux_dnn.conv_plan(x, w)
        assert plan.shim == REGISTRY.shim_for(1, dtype).name
        assert plan.shim in {s.name for s in flux_dnn.shims() if s.usable}
    # float64: oneDNN has no float64 kernels, so the BLAS shim serves it wherever it is installed
    assert plan.shim == "blas"

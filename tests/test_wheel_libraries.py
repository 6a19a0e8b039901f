"""The one vendor-wheel lookup (flux_dnn._discovery.find_wheel_file / load_wheel_library) and
the load-order rule of the registry: the CPU shims' vendor libraries are loaded, RTLD_LOCAL,
before any other shim. Each process-level check runs in a fresh interpreter, where nothing
is loaded yet."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from flux_dnn._discovery import find_wheel_file, load_wheel_library, onednn_wheel_here

needs_onednn_wheel = pytest.mark.skipif(
    not onednn_wheel_here() or find_wheel_file("onednn-cpu-gomp", "libdnnl.so.3") is None,
    reason="the onednn-cpu-gomp wheel exists for Linux x86-64 only, and must be installed",
)


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_missing_wheel_or_file_is_none_and_a_load_names_both():
    assert find_wheel_file("no-such-distribution-xyz", "libx.so") is None
    assert find_wheel_file("numpy", "no_such_file.so") is None
    with pytest.raises(OSError, match=r"libx\.so not found: the no-such-distribution-xyz wheel"):
        load_wheel_library("no-such-distribution-xyz", "libx.so")


@needs_onednn_wheel
def test_the_cpu_onednn_is_loaded_by_path_and_kept_local():
    """The oneDNN shim works, its libdnnl.so.3 is the wheel's, and oneDNN's symbols are not
    in the global scope (RTLD_LOCAL): another libdnnl.so.3 loaded later cannot meet them."""
    out = _run(
        """
        import ctypes, numpy as np, flux_dnn
        from flux_dnn._discovery import REGISTRY, find_wheel_file
        x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
        y = flux_dnn.conv2d(x, w)
        assert REGISTRY.shim_for(1, "float32").name == "onednn"
        assert float(y.min()) == float(y.max()) == 18.0, y
        wheel = str(find_wheel_file("onednn-cpu-gomp", "libdnnl.so.3.2")
                    or find_wheel_file("onednn-cpu-gomp", "libdnnl.so.3"))
        maps = open("/proc/self/maps").read()
        print("wheel-loaded", wheel in maps)
        print("global", hasattr(ctypes.CDLL(None), "dnnl_version"))
        """
    )
    assert "wheel-loaded True" in out and "global False" in out, out


@needs_onednn_wheel
def test_cpu_preloads_run_before_another_shim_loads():
    """The registry's rule: a non-CPU shim's preload finds the CPU oneDNN already loaded
    (a by-name lookup of libdnnl.so.3 returns the first object loaded with that soname)."""
    out = _run(
        """
        from flux_dnn import _core, _onednn
        from flux_dnn._discovery import Registry, ShimSpec, _Entry, find_wheel_file
        wheel = str(find_wheel_file("onednn-cpu-gomp", "libdnnl.so.3.2")
                    or find_wheel_file("onednn-cpu-gomp", "libdnnl.so.3"))
        seen = []
        def preload():
            seen.append(wheel in open("/proc/self/maps").read())
            raise OSError("a test shim: nothing to load")
        registry = Registry()
        registry._entries = [
            _Entry("other", ShimSpec("other", _core.DEVICE_ROCM, "/nonexistent/libother.so", preload=preload), None),
            _Entry("onednn", _onednn.shim_spec(), None),
        ]
        print("before", wheel in open("/proc/self/maps").read())
        usable, failures = registry.usable_for(_core.DEVICE_ROCM, loud=False)
        print("seen", seen, [f.name for f in failures])
        """
    )
    assert "before False" in out and "seen [True] ['other']" in out, out


@pytest.mark.parametrize("order", ["torch first", "flux_dnn first"])
def test_torch_and_the_onednn_shim_share_a_process(order):
    """torch (its own libgomp and oneDNN) and the oneDNN shim (the wheel's oneDNN, RTLD_LOCAL)
    in one process, in either import order: both compute the same convolution."""
    pytest.importorskip("torch")
    first = "import torch; import flux_dnn" if order == "torch first" else "import flux_dnn; import torch"
    out = _run(
        first
        + """
import numpy as np
rng = np.random.default_rng(0)
x, w = rng.standard_normal((2, 4, 9, 9)).astype(np.float32), rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
ours = flux_dnn.conv2d(x, w, padding=1)
theirs = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
t = flux_dnn.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)
np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(t.numpy(), theirs, rtol=1e-4, atol=1e-4)
print("ok", flux_dnn._discovery.REGISTRY.shim_for(1, "float32").name)
"""
    )
    assert out.startswith("ok"), out

"""ABI 2.2's FDNN_Device_Allocator: a shim that benchmarks on a device times its candidates
on buffers the core lends it from the array library's allocator (the library's pool, in
stream order), never on buffers of its own, and gives every one back before the plan is
made. Runs on every backend off the CPU (the MIOpen shim on its test double here)."""

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _adapters, _core

from .libraries import off_cpu


@pytest.fixture
def fresh_autotune(tmp_path):
    """An empty autotune store, so that the benchmark runs instead of a remembered choice."""
    kept = _core.autotune_path()
    _core.set_autotune_path(str(tmp_path / "autotune.txt"))
    flux_dnn.clear_plan_cache()
    yield
    _core.set_autotune_path(kept)


class _Recording:
    """The adapter's workspace allocator, counting what it lends and what is still held."""

    def __init__(self, adapter):
        self.adapter, self.original = adapter, adapter.workspace
        self.sizes, self.alive = [], []

    def __call__(self, like, nbytes):
        import weakref

        array = self.original(like, nbytes)
        self.sizes.append(nbytes)
        try:
            self.alive.append(weakref.ref(array))
        except TypeError:  # a library whose arrays take no weak references
            pass
        return array


@pytest.mark.matrix(libraries="first", where=off_cpu)
def test_benchmark_buffers_come_from_the_array_library(backend, rng, fresh_autotune, monkeypatch):
    backend.require("forward", "float32", 2, features=("benchmark",))
    lib = backend.lib
    n, c, k, h = 2, int(rng.integers(3, 9)), int(rng.integers(3, 9)), int(rng.integers(6, 14))
    x, w = rng.standard_normal((n, c, h, h)), rng.standard_normal((k, c, 3, 3))
    xd, wd = lib.array(x, "float32"), lib.array(w, "float32")
    adapter = _adapters._BY_TYPE.get(type(xd)) or _adapters.adapter_for(xd, "x")
    recording = _Recording(adapter)
    monkeypatch.setattr(adapter, "workspace", recording)
    # Full float32 math: the benchmark would pick TF32 engines on NVIDIA GPUs (the default),
    # whose error on standard-normal data is above this tolerance; the test is about buffers.
    y = flux_dnn.conv2d(xd, wd, padding=1, algorithm="benchmark", allow_reduced_precision=False)
    expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    np.testing.assert_allclose(lib.numpy(y), expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())
    # The stand-ins for x and w are exactly their sizes (execute's workspace never is both).
    x_bytes, w_bytes = x.size * 4, w.size * 4
    assert x_bytes in recording.sizes and w_bytes in recording.sizes, (
        f"the benchmark's stand-ins for x ({x_bytes} bytes) and w ({w_bytes} bytes) did not come "
        f"from the array library's allocator, which lent: {recording.sizes}"
    )
    # Every benchmark buffer is given back (only execute's workspace may be alive: none here).
    import gc

    gc.collect()
    assert sum(r() is not None for r in recording.alive) == 0

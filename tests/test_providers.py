"""The provider interface (flux_dnn.providers): lookup through the entry-point group, the
core's two streams (the shim's pointer and __dlpack__'s argument), and providers of plug-ins
reaching the one call path. No GPU: the ROCm-typed host arrays of a fake provider and the
CPU shims carry the calls."""

from __future__ import annotations

import importlib.metadata
import os

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _adapters, _conv, _core, providers
from flux_dnn._discovery import REGISTRY, install_hint


class Recording:
    """A CPU array that records what its __dlpack__ is given (NumPy memory underneath)."""

    def __init__(self, a: np.ndarray):
        self.a, self.streams = a, []
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, stream=None, max_version=None, **_):
        self.streams.append(stream)
        return self.a.__dlpack__(max_version=max_version) if max_version else self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def _forward_spec(shim):
    return _core.ConvSpec(_core.CONV_FORWARD, 2, [1, 1], [1, 1], [0, 0], [0, 0], 1, flags=0)


def _arrays(rng):
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    return x, w, np.full((1, 3, 3, 3), np.nan, np.float32)


@pytest.mark.parametrize(
    "stream, seen",
    [
        ((0, "queue-object"), "queue-object"),  # SYCL-like: a pointer for the shim, an object for __dlpack__
        ((0, None), None),  # the keyword is not sent
        ((None, 7), 7),
    ],
)
def test_the_core_hands_dlpack_its_own_stream(rng, stream, seen):
    """run_conv's stream as a pair: its second item is what every array's __dlpack__ gets;
    the first is the shim's (the CPU shims ignore it)."""
    shim = REGISTRY.shim_for(_core.DEVICE_CPU, "float32").shim
    x, w, y = _arrays(rng)
    rx, rw, ry = Recording(x), Recording(w), Recording(y)
    _core.run_conv(shim, _forward_spec(shim), rx, rw, ry, None, stream, None)
    assert rx.streams == rw.streams == ry.streams == [seen]
    np.testing.assert_allclose(y, ref.conv_forward(x, w, None, (1, 1), (0, 0), (0, 0), (1, 1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "stream, words",
    [
        ((1, 2, 3), "a pair"),
        (("not a pointer", None), "must be an int"),
        (1.5, "must be an int"),
    ],
)
def test_a_malformed_stream_is_refused_naming_it(rng, stream, words):
    shim = REGISTRY.shim_for(_core.DEVICE_CPU, "float32").shim
    x, w, y = _arrays(rng)
    with pytest.raises(TypeError, match="stream") as info:
        _core.run_conv(shim, _forward_spec(shim), Recording(x), Recording(w), y, None, stream, None)
    assert words in str(info.value)


def test_flux_dnns_own_providers_come_from_entry_points():
    registered = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=providers.ENTRY_POINT_GROUP)}
    assert registered["numpy"] == "flux_dnn._adapters:NumpyProvider"
    assert {"torch", "cupy", "jaxlib", "mlx"} <= set(registered)
    assert isinstance(providers.provider_for(np.zeros(1), "x"), _adapters.NumpyProvider)


def test_an_array_of_an_unregistered_module_takes_the_array_api_provider():
    assert type(providers.provider_for(Recording(np.zeros(1)), "x")) is providers.Provider


class _BrokenEntryPoint:
    name, value = "brokenlib", "brokenlib_plugin:Provider"

    def load(self):
        raise ImportError("no module named brokenlib_plugin")


def test_a_provider_that_fails_to_load_is_an_error_naming_its_entry_point(monkeypatch):
    monkeypatch.setitem(providers._registered(), "brokenlib", _BrokenEntryPoint())
    monkeypatch.delitem(providers._BY_MODULE, "brokenlib", raising=False)
    with pytest.raises(ImportError, match="brokenlib_plugin:Provider.*no module named brokenlib_plugin"):
        providers.provider_of_module("brokenlib")


def test_register_refuses_what_is_not_a_provider():
    with pytest.raises(TypeError, match="provider: expected a flux_dnn.providers.Provider"):
        providers.register(Recording, object())


class HostRocm:
    """NumPy memory that says it is on ROCm device 0: a device with streams, served by the
    MIOpen shim only where flux-dnn-rocm is installed (here: no shim, so the call path up
    to dispatch is what runs)."""

    def __init__(self, a):
        self.a, self.shape, self.dtype = a, a.shape, a.dtype

    def __dlpack__(self, stream=None, max_version=None, **_):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (_core.DEVICE_ROCM, 0)


class HostRocmProvider(providers.Provider):
    """A plug-in's provider in the new form: streams() gives a pair."""

    name = "host-rocm"
    calls: list = []

    def device(self, a):
        return (_core.DEVICE_ROCM, 0)

    def dtype_name(self, a, argname="array"):
        return a.dtype.name

    def empty(self, like, shape, channels_last):
        return HostRocm(np.empty(shape, like.dtype))

    def streams(self, like):
        self.calls.append("streams")
        return providers.Streams(0, None)


def test_a_plug_in_provider_reaches_dispatch(monkeypatch, rng):
    """Arrays of a registered provider go through the one call path: without a ROCm shim the
    dispatch error names the device and what to install (flux-dnn's own hint)."""
    monkeypatch.setitem(providers._BY_TYPE, HostRocm, HostRocmProvider())
    _conv._memo.clear()
    x, w, _ = _arrays(rng)
    try:
        usable, _ = REGISTRY.usable_for(_core.DEVICE_ROCM, loud=False)
    except Exception:  # noqa: BLE001
        usable = []
    if usable:
        pytest.skip("a ROCm shim is installed here: this test checks the path without one")
    with pytest.raises(flux_dnn.DeviceUnavailableError, match="ROCm") as info:
        flux_dnn.conv2d(HostRocm(x), HostRocm(w))
    assert install_hint(_core.DEVICE_ROCM) in str(info.value)


def test_install_hints_come_from_entry_points():
    registered = [ep.value for ep in importlib.metadata.entry_points(group="flux_dnn.install_hints")]
    assert "flux_dnn._install_hints:hints" in registered
    assert "flux-dnn-cuda13" in install_hint(_core.DEVICE_CUDA)
    assert install_hint(12345) == "a flux_dnn shim package for that device"


def test_conformance_libraries_of_plug_ins_are_listed():
    from flux_dnn import conformance

    assert isinstance(conformance.registered_libraries(), list)
    broken = conformance.UnloadableLibrary("x", "entry point failed")
    assert broken.unavailable() == "entry point failed"


def test_torch_xpu_tensors_give_the_current_streams_sycl_queue():
    """torch XPU (no XPU here: a stand-in for torch.xpu): the shim gets the current stream's
    sycl_queue (a sycl::queue* as an int), __dlpack__ gets no stream."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    asked = []

    def current_stream(device):
        asked.append(device)
        return SimpleNamespace(sycl_queue=0x5EED)

    fake_torch = SimpleNamespace(xpu=SimpleNamespace(current_stream=current_stream))
    like = SimpleNamespace(device="xpu:1")
    assert _adapters._xpu_streams(fake_torch, like) == providers.Streams(0x5EED, None)
    assert asked == ["xpu:1"]


PLUGIN_MODULE = '''
import numpy as np
from flux_dnn import _core
from flux_dnn.conformance import ArrayLibrary
from flux_dnn.providers import Provider


class Array:
    """NumPy memory under a type of another module: what a plug-in's array library is to flux_dnn."""

    def __init__(self, a):
        self.a, self.shape, self.dtype = a, a.shape, a.dtype

    def __dlpack__(self, stream=None, max_version=None, **_):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class FakeProvider(Provider):
    name = "fakearrays"
    made = []

    def dtype_name(self, a, argname="array"):
        return a.dtype.name

    def strides(self, a):
        return tuple(s // a.a.itemsize for s in a.a.strides)

    def empty(self, like, shape, channels_last):
        self.made.append(shape)
        return Array(np.empty(shape, like.dtype))


class FakeLibrary(ArrayLibrary):
    name = "fakearrays"

    def unavailable(self):
        return None


def libraries():
    return [FakeLibrary()]


HINTS = {_core.DEVICE_ONEAPI: "pip install flux-dnn-fake"}
'''


def test_a_plug_in_registers_provider_hint_and_conformance_library_through_entry_points(tmp_path):
    """An installed distribution (here a dist-info folder on sys.path) reaches flux_dnn only
    through its entry points: its arrays get its provider, its hint is used, its conformance
    library is listed. Run in a fresh interpreter, whose entry points include it."""
    import subprocess
    import sys

    (tmp_path / "fakearrays.py").write_text(PLUGIN_MODULE)
    info = tmp_path / "flux_dnn_fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flux-dnn-fake\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[flux_dnn.providers]\nfakearrays = fakearrays:FakeProvider\n\n"
        "[flux_dnn.install_hints]\nfake = fakearrays:HINTS\n\n"
        "[flux_dnn.conformance_libraries]\nfake = fakearrays:libraries\n"
    )
    code = """
import numpy as np, flux_dnn, fakearrays
from flux_dnn import _core, conformance, providers
from flux_dnn._discovery import install_hint
x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
y = flux_dnn.conv2d(fakearrays.Array(x), fakearrays.Array(w))
assert type(y) is fakearrays.Array and fakearrays.FakeProvider.made == [(1, 3, 3, 3)], y
assert float(y.a.min()) == float(y.a.max()) == 18.0
assert type(providers.provider_for(y, "y")) is fakearrays.FakeProvider
assert install_hint(_core.DEVICE_ONEAPI) == "pip install flux-dnn-fake"
assert [lib.name for lib in conformance.registered_libraries()] == ["fakearrays"]
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]

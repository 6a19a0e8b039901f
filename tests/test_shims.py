"""Shim loading and dispatch: the core's checks of a shim's table, what a shim reports of
itself (info, device, capabilities) through _core, the order shims are asked in, and listing
that shows every shim, failed ones with their reason, and never raises.

Most tests drive tests/fake_shim.c, a complete ABI shim with no vendor behind it, so that they
check the core and the dispatcher, not a vendor."""

import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _conv, _core
from flux_dnn._discovery import REGISTRY, Registry

REPO = pathlib.Path(__file__).resolve().parent.parent
HEADER_DIR = REPO / "csrc" / "include"
FAKE_SHIM = pathlib.Path(__file__).with_name("fake_shim.c")

# A shim that is complete in form but was "built" for the next ABI major: the core must refuse it.
FOREIGN_SHIM = r"""
#include "flux_dnn/flux_dnn.h"
static FDNN_Api api;
FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) {
  api.struct_size = FDNN_Api_STRUCT_SIZE;
  api.abi_major = FDNN_ABI_MAJOR + 1;
  api.abi_minor = 3;
  return &api;
}
"""


def compiler():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a test shim")
    return cc


def compile_shim(tmp_path, source, name, *defines):
    """Builds a shim from C source text (or the path of a .c file) into tmp_path."""
    src = source if isinstance(source, pathlib.Path) else tmp_path / f"{name}.c"
    if not isinstance(source, pathlib.Path):
        src.write_text(source)
    lib = tmp_path / f"lib{name}.so"
    subprocess.run(
        [
            compiler(),
            "-shared",
            "-fPIC",
            "-std=c11",
            "-Wall",
            "-Werror",
            f"-I{HEADER_DIR}",
            *(f"-D{d}" for d in defines),
            str(src),
            "-o",
            str(lib),
        ],
        check=True,
    )
    return lib


def fake_shim(tmp_path, name="fake", *defines):
    """tests/fake_shim.c built as shim `name` (a library of its own: loaded shims stay loaded)."""
    return compile_shim(tmp_path, FAKE_SHIM, name, f'FAKE_NAME="{name}"', *defines)


def counter(lib, name, ctype=ctypes.c_int):
    """A global the fake shim exports, read from the loaded instance the core uses."""
    return ctype.in_dll(ctypes.CDLL(str(lib)), name).value


def test_onednn_shim_is_listed_and_usable():
    status = {s.name: s for s in flux_dnn.shims()}
    onednn = status["onednn"]
    assert onednn.usable and onednn.loaded and onednn.found
    assert onednn.vendor == "oneDNN" and onednn.vendor_version_runtime.startswith("3.")
    assert onednn.device_type == 1 and onednn.num_devices == 1
    assert onednn.priority == _core.PRIORITY_VENDOR and onednn.abi == flux_dnn.ABI_VERSION
    assert onednn.shim_version == _core.__version__ and onednn.default_flags == 0  # no TF32 on CPUs
    assert "float32" in onednn.dtypes and onednn.capabilities["forward"]["float32"]["spatial_ranks"] == (1, 2, 3)


def test_cpu_shims_are_asked_by_priority():
    usable, _ = REGISTRY.usable_for(1)
    priorities = [e.priority for e in usable]
    assert priorities == sorted(priorities, reverse=True)
    if os.environ.get("FLUX_DNN_SHIMS"):
        pytest.skip("FLUX_DNN_SHIMS pins the CPU shims")
    if {e.name for e in usable} >= {"onednn", "blas"}:
        assert [e.name for e in usable].index("onednn") < [e.name for e in usable].index("blas")
        assert REGISTRY.shim_for(1, "float32").name == "onednn"
        assert REGISTRY.shim_for(1, "float64").name == "blas"  # oneDNN has no float64 kernels


def test_core_refuses_another_abi_major(tmp_path):
    lib = compile_shim(tmp_path, FOREIGN_SHIM, "foreign")
    major, minor = flux_dnn.ABI_VERSION
    with pytest.raises(
        flux_dnn.ShimLoadError,
        match=rf"built for flux_dnn ABI {major + 1}\.3, but this flux_dnn core speaks ABI {major}\.{minor}",
    ):
        _core.load_shim(str(lib))


@pytest.mark.parametrize(
    "defines,match",
    [
        (
            ("FAKE_NULL_CAPABILITIES", "FAKE_NULL_EXECUTE"),
            r"has an incomplete function table: Conv_Capabilities, Conv_Plan_Execute NULL",
        ),
        (("FAKE_SHORT_TABLE",), r"has a function table of \d+ bytes, smaller than the \d+ of ABI 2\.0"),
    ],
)
def test_core_refuses_an_incomplete_table(tmp_path, defines, match):
    lib = fake_shim(tmp_path, "incomplete", *defines)
    with pytest.raises(flux_dnn.ShimLoadError, match=match):
        _core.load_shim(str(lib))


def test_core_refuses_a_library_that_is_no_shim(tmp_path):
    lib = compile_shim(tmp_path, "int nothing_here(void) { return 0; }\n", "noshim")
    with pytest.raises(flux_dnn.ShimLoadError, match=r"is not a flux_dnn shim: it does not export fdnn_get_api"):
        _core.load_shim(str(lib))
    with pytest.raises(flux_dnn.ShimLoadError, match=r"cannot load shim library .*missing\.so"):
        _core.load_shim(str(tmp_path / "missing.so"))


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch):
    """A real installed plugin (a dist-info with an entry point) whose shim cannot load."""
    (tmp_path / "broken_flux_plugin.py").write_text(
        textwrap.dedent("""
        from flux_dnn import ShimSpec
        def shim_spec():
            return ShimSpec(name="brokenrocm", device_type=10, library="/nonexistent/libflux_dnn_broken.so",
                            install_hint="pip install flux-dnn-rocm-fixed")
    """)
    )
    dist = tmp_path / "broken_flux_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-flux-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[flux_dnn.shims]\nbrokenrocm = broken_flux_plugin:shim_spec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    REGISTRY.reset()
    _conv._memo.clear()  # a remembered pattern holds the shim it was dispatched to
    yield
    REGISTRY.reset()
    _conv._memo.clear()


def test_failed_shim_is_listed_with_reason(broken_plugin):
    status = {s.name: s for s in flux_dnn.shims()}
    assert status["onednn"].usable  # one broken plugin does not break the others
    broken = status["brokenrocm"]
    assert broken.found and not broken.loaded and not broken.usable
    assert "cannot load shim library /nonexistent/libflux_dnn_broken.so" in broken.reason


def test_failed_shim_raises_only_when_its_device_is_asked_for(broken_plugin, rng):
    import numpy as np

    from test_errors import OtherDevice

    serving = [s.name for s in flux_dnn.shims() if s.device_type == 10 and s.usable]
    if serving:  # e.g. flux-dnn-rocm on the MIOpen test double, which the conformance suite loads
        pytest.skip(f"ROCm arrays have a usable shim here ({', '.join(serving)}), not only the broken one")
    x = rng.standard_normal((1, 2, 5, 5), dtype=np.float32)
    w = rng.standard_normal((2, 2, 3, 3), dtype=np.float32)
    flux_dnn.conv2d(x, w)  # CPU unaffected
    with pytest.raises(flux_dnn.DeviceUnavailableError) as info:
        flux_dnn.conv2d(OtherDevice(x, (10, 0)), OtherDevice(w, (10, 0)))
    message = str(info.value)
    assert "ROCm" in message and "brokenrocm" in message and "/nonexistent/libflux_dnn_broken.so" in message
    assert "pip install flux-dnn-rocm-fixed" in message


def run_python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def test_import_loads_no_vendor_library():
    code = (
        "import flux_dnn, pathlib; maps = pathlib.Path('/proc/self/maps').read_text(); "
        "print('dnnl' in maps, 'flux_dnn_onednn' in maps)"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_explicit_shim_selection_fails_loudly():
    code = (
        "import numpy as np, flux_dnn; flux_dnn.conv2d(np.zeros((1,1,3,3),np.float32), np.zeros((1,1,3,3),np.float32))"
    )
    result = run_python(code, FLUX_DNN_SHIMS="onednn,nosuchshim")
    assert result.returncode != 0
    assert "FLUX_DNN_SHIMS names 'nosuchshim', but no such shim is installed" in result.stderr
    assert run_python(code, FLUX_DNN_SHIMS="onednn").returncode == 0


def test_shim_reports_itself_through_core(tmp_path):
    shim = _core.load_shim(str(fake_shim(tmp_path, "selfreport", "FAKE_PRIORITY=33", "FAKE_FLOAT16")))
    assert _core.load_shim(shim.path) is shim  # loaded once
    info = shim.info()
    assert (info["name"], info["priority"], info["shim_version"], info["device_type"]) == ("selfreport", 33, "9.9.9", 1)
    assert info["unavailable_reason"] is None and info["abi"] == flux_dnn.ABI_VERSION
    assert shim.device_info() == {"name": "fake device 0", "default_flags": _core.CONV_ALLOW_REDUCED_PRECISION}
    assert shim.capabilities(_core.CONV_FORWARD, "float32") == {
        "support": _core.SUPPORT_NATIVE,
        "spatial_ranks": (2,),
        "activations": (1 << _core.ACTIVATION_NONE) | (1 << _core.ACTIVATION_RELU),
        "features": _core.FEATURE_GROUPS | _core.FEATURE_ALPHA_BETA,
        "detail": "fake float32 kernels",
    }
    backward = shim.capabilities(_core.CONV_BACKWARD_WEIGHT, "float16", device_id=0)
    assert backward["support"] == _core.SUPPORT_CONVERTED and backward["activations"] == 1 << _core.ACTIVATION_NONE
    assert shim.capabilities(_core.CONV_FORWARD, "float64") == {
        "support": _core.SUPPORT_NONE,
        "spatial_ranks": (),
        "activations": 0,
        "features": 0,
        "detail": "fake computes float32 only",
    }
    with pytest.raises(ValueError, match=r"dtype: expected 'float64', 'float32', 'float16' or 'bfloat16', got 'int8'"):
        shim.capabilities(_core.CONV_FORWARD, "int8")
    with pytest.raises(ValueError, match=r"\[selfreport\] Conv_Capabilities: no such op 7"):
        shim.capabilities(7, "float32")
    with pytest.raises(ValueError, match=r"\[selfreport\] Device_Describe: no such device 3"):
        shim.device_info(3)


@pytest.fixture
def small_plan_cache():
    before = _core.plan_cache_info()["capacity"]
    _core.clear_plan_cache()
    yield
    _core.set_plan_cache_capacity(before)


def forward_spec(groups=1, flags=0):
    return _core.ConvSpec(_core.CONV_FORWARD, 2, [1, 1], [1, 1], [0, 0], [0, 0], groups, flags=flags)


def test_plan_cache_is_lru_and_destroys_what_it_drops(tmp_path, small_plan_cache):
    """Plans are keyed by shapes and data alignment; the least recently used is dropped, and
    its vendor plan destroyed, when the cache is full; clearing destroys the rest."""
    lib = fake_shim(tmp_path, "cached")
    shim = _core.load_shim(str(lib))
    _core.set_plan_cache_capacity(2)
    spec = forward_spec()
    w = np.ones((1, 1, 1, 1), np.float32)

    def run(x):
        y = np.full(x.shape, np.nan, np.float32)
        assert _core.run_conv(shim, spec, x, w, y, None, None, None) is None
        assert y.flat[0] == 42 and np.isnan(y.flat[1:]).all()  # the shim got y's first element
        return counter(lib, "fake_plans_created"), counter(lib, "fake_plans_destroyed")

    storage = np.zeros(64 + 4, np.float32)
    aligned = storage[(-storage.ctypes.data % 16) // 4 :][:16].reshape(1, 1, 4, 4)
    offset = storage[(-storage.ctypes.data % 16) // 4 + 1 :][:16].reshape(1, 1, 4, 4)  # 4-byte aligned
    assert run(aligned) == (1, 0)
    assert run(aligned) == (1, 0)  # a hit
    assert run(offset) == (2, 0)  # same shape, another alignment: another plan
    assert counter(lib, "fake_last_x_address", ctypes.c_size_t) == offset.ctypes.data
    assert run(np.zeros((1, 1, 5, 5), np.float32)) == (3, 1)  # full: the oldest (aligned) dropped
    assert run(offset) == (3, 1)
    assert run(aligned) == (4, 2)
    assert _core.plan_cache_info()["evictions"] >= 2
    _core.clear_plan_cache()
    assert counter(lib, "fake_plans_destroyed") == 4
    assert counter(lib, "fake_executions") == 6
    info = _core.plan_info(shim, spec, aligned, w, np.empty_like(aligned), None)
    assert info == {"workspace_size": 0, "algo_id": 7, "algo_name": "fake algorithm"}


def test_a_shim_that_cannot_pack_keeps_the_callers_weights(tmp_path, small_plan_cache):
    lib = fake_shim(tmp_path, "nopack")
    shim = _core.load_shim(str(lib))
    x, w = np.zeros((1, 1, 4, 4), np.float32), np.ones((1, 1, 1, 1), np.float32)
    packed = _core.PackedConv(shim, forward_spec(), x, w, np.empty_like(x), None, None)
    assert not packed.packed and packed.algo_name == "fake algorithm"
    y = np.full(x.shape, np.nan, np.float32)
    assert packed.run(x, y, None, None, None) is y and y.flat[0] == 42


def test_weights_given_as_a_capsule_to_a_shim_that_cannot_pack_are_passed_again_each_run(tmp_path, small_plan_cache):
    """torch's fast exporter hands the core DLPack capsules, which one use consumes: a plan on
    a shim that cannot pack (cuDNN, MIOpen) must get w again on every run (the first GPU run
    found every such torch plan failing with 'w: __dlpack__ did not return a DLPack capsule')."""
    lib = fake_shim(tmp_path, "nopack")
    shim = _core.load_shim(str(lib))
    x, w = np.zeros((1, 1, 4, 4), np.float32), np.ones((1, 1, 1, 1), np.float32)
    packed = _core.PackedConv(shim, forward_spec(), x, w.__dlpack__(), np.empty_like(x), None, None)
    assert not packed.packed
    y = np.full(x.shape, np.nan, np.float32)
    with pytest.raises(TypeError, match=r"^w: this plan's weights were given as a DLPack capsule"):
        packed.run(x, y, None, None, None)
    assert np.isnan(y).all()  # refused before the shim was called
    for _ in range(3):  # a fresh capsule each time
        y = np.full(x.shape, np.nan, np.float32)
        assert packed.run_with_weights(x, y, None, None, None, w.__dlpack__()) is y and y.flat[0] == 42


# -- dispatch among several shims of one device -----------------------------------------------

ONEAPI = 14  # a device type no real shim here serves: the fakes have it to themselves


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    """Three installed plugins (dist-infos with entry points) for oneAPI devices: "fakelow"
    (priority 5, float32 and float16), "fakehigh" (priority 50, float32), and "fakeoff"
    (priority 90, unavailable), listed in that order. Yields the folder to put on sys.path."""
    libs = {
        "fakelow": fake_shim(tmp_path, "fakelow", "FAKE_PRIORITY=5", "FAKE_FLOAT16", f"FAKE_DEVICE_TYPE={ONEAPI}"),
        "fakehigh": fake_shim(tmp_path, "fakehigh", "FAKE_PRIORITY=50", f"FAKE_DEVICE_TYPE={ONEAPI}"),
        "fakeoff": fake_shim(
            tmp_path,
            "fakeoff",
            "FAKE_PRIORITY=90",
            f"FAKE_DEVICE_TYPE={ONEAPI}",
            'FAKE_UNAVAILABLE="no fake device here"',
        ),
    }
    (tmp_path / "fake_flux_plugins.py").write_text(
        "from flux_dnn import ShimSpec\n"
        + "".join(
            f"def {name}():\n    return ShimSpec(name={name!r}, device_type={ONEAPI}, library={str(lib)!r})\n"
            for name, lib in libs.items()
        )
    )
    dist = tmp_path / "fake_flux_plugins-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-flux-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[flux_dnn.shims]\n" + "".join(f"{name} = fake_flux_plugins:{name}\n" for name in libs)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("FLUX_DNN_SHIMS", raising=False)
    yield tmp_path


def names(entries):
    return [e.name for e in entries]


def test_shims_are_asked_by_their_reported_priority(fake_plugins):
    registry = Registry()
    assert names(registry.candidates(ONEAPI, "float32")) == ["fakehigh", "fakelow"]
    assert names(registry.candidates(ONEAPI, "float16", 0, "x", op=_core.CONV_BACKWARD_DATA)) == ["fakelow"]
    assert registry.shim_for(ONEAPI, "float32").name == "fakehigh"
    assert registry.shim_for(ONEAPI, "float32").default_flags() == _core.CONV_ALLOW_REDUCED_PRECISION
    usable, failures = registry.usable_for(ONEAPI)
    assert names(usable) == ["fakehigh", "fakelow"] and names(failures) == ["fakeoff"]
    with pytest.raises(TypeError) as info:
        registry.candidates(ONEAPI, "float64", 0, "dy")
    assert str(info.value).splitlines() == [
        "dy: dtype float64 is not supported by any shim for oneAPI arrays here:",
        "  shim 'fakehigh' computes float32 (fake computes float32 only)",
        "  shim 'fakelow' computes float32, float16 (fake computes float32 only)",
        "  shim 'fakeoff' is not usable: no fake device here",
        "  accepted dtypes: float64, float32, float16, bfloat16",
    ]


def test_flux_dnn_shims_pins_set_and_order(fake_plugins, monkeypatch):
    monkeypatch.setenv("FLUX_DNN_SHIMS", "fakelow,fakehigh")
    registry = Registry()
    assert names(registry.candidates(ONEAPI, "float32")) == ["fakelow", "fakehigh"]
    assert names(registry.usable_for(1)[0]) == []  # the CPU shims are not named
    monkeypatch.setenv("FLUX_DNN_SHIMS", "fakeoff")
    with pytest.raises(flux_dnn.DeviceUnavailableError, match=r"shim 'fakeoff': no fake device here"):
        Registry().candidates(ONEAPI, "float32")


def run_info(**env):
    return subprocess.run(
        [sys.executable, "-m", "flux_dnn", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_info_shows_order_and_serving_per_device(fake_plugins):
    result = run_info(PYTHONPATH=os.pathsep.join([str(fake_plugins), *sys.path]))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("oneAPI arrays:\n", 1)[1].splitlines()[:5]
    assert section == [
        "  order:    fakehigh (priority 50, version 9.9.9, default flags ALLOW_REDUCED_PRECISION), "
        "fakelow (priority 5, version 9.9.9, default flags ALLOW_REDUCED_PRECISION)",
        "  float64:  not supported",
        "  float32:  fakehigh",
        "  float16:  fakelow (converted)",
        "  bfloat16: not supported",
    ]
    assert "shim fakeoff [oneAPI]: loaded, unavailable" in result.stdout
    assert "why not:  no fake device here" in result.stdout


def test_listing_shows_shims_that_fail_to_load_and_never_raises(tmp_path):
    """FLUX_DNN_SHIMS naming a missing library, a file that is no library, and a name that is
    not installed: info and shims() list each with its reason; a convolution fails loudly."""
    garbage = tmp_path / "libgarbage.so"
    garbage.write_text("not a shared library\n")
    good = fake_shim(tmp_path, "fakecpu")
    wanted = ",".join([str(good), "/nonexistent/libflux_dnn_gone.so", str(garbage), "nosuchshim"])
    result = run_info(FLUX_DNN_SHIMS=wanted)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "shim fakecpu [CPU]: usable" in out
    assert "shim /nonexistent/libflux_dnn_gone.so [device unknown]: not loaded" in out
    assert "cannot load shim library /nonexistent/libflux_dnn_gone.so" in out
    assert f"cannot load shim library {garbage}" in out
    assert "FLUX_DNN_SHIMS names 'nosuchshim', but no such shim is installed" in out
    assert "CPU arrays:\n  order:    fakecpu (priority 1, version 9.9.9" in out
    listing = subprocess.run(
        [sys.executable, "-c", "import flux_dnn; print(sorted((s.name, s.usable) for s in flux_dnn.shims()))"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLUX_DNN_SHIMS": wanted},
    )
    assert listing.returncode == 0, listing.stderr
    assert "('fakecpu', True), ('nosuchshim', False)" in listing.stdout
    code = (
        "import numpy as np, flux_dnn; flux_dnn.conv2d(np.zeros((1,1,3,3),np.float32), np.zeros((1,1,3,3),np.float32))"
    )
    run = run_python(code, FLUX_DNN_SHIMS=wanted)
    assert run.returncode != 0
    assert "ShimLoadError: shim '/nonexistent/libflux_dnn_gone.so' named in FLUX_DNN_SHIMS failed to load" in run.stderr


def test_info_command_prints_onednn_version():
    result = subprocess.run([sys.executable, "-m", "flux_dnn", "info"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "shim onednn [CPU]: usable" in result.stdout and "oneDNN 3." in result.stdout


def test_info_tells_the_truth_per_dtype(rng):
    """Every dtype `info` lists for CPU arrays runs on the shim it names, in the way the shim
    reports (a converted dtype's plan says it computes in float32), and matches float64."""
    import reference as ref
    from conftest import DTYPES, numpy_dtype

    result = subprocess.run([sys.executable, "-m", "flux_dnn", "info"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("CPU arrays:\n", 1)[1].splitlines()
    assert section[0].startswith("  order:    ")
    serving = section[1 : 1 + len(DTYPES)]
    statuses = {s.name: s for s in flux_dnn.shims()}
    for line in serving:
        dtype, shim = line.split()[:2]
        dtype = dtype.rstrip(":")
        if shim == "not":  # "not supported"
            continue
        how, _ = statuses[shim].dtype_support[dtype]
        assert ("(converted)" in line) == (how == "converted"), line
        x = (rng.integers(-4, 5, (2, 4, 7, 6)) / 4).astype(numpy_dtype(dtype))
        w = (rng.integers(-4, 5, (3, 4, 3, 3)) / 4).astype(numpy_dtype(dtype))
        plan = flux_dnn.conv_plan(x, w, padding=1)
        y = plan(x)
        assert y.dtype == x.dtype
        np.testing.assert_allclose(
            y.astype(np.float64), ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1)), rtol=1e-2, atol=1e-2
        )
        if shim == "onednn":
            assert ("computed in float32" in plan.algorithm) == (how == "converted"), (dtype, plan.algorithm)
    assert {line.split()[0].rstrip(":") for line in serving} == set(DTYPES)


# -- the XLA FFI handler, which loads shims through the same client library ---------------------


def ffi_attrs(name, groups=1, flags=-1):
    """The attributes of one 2-D forward convolution through flux_dnn's XLA FFI handler,
    with no padding, on the shim registered as `name`."""
    ones, zeros, order = np.ones(2, np.int64), np.zeros(2, np.int64), np.arange(4, dtype=np.int64)
    return dict(
        shim=name,
        abi_major=np.int64(_core.ABI_MAJOR),
        op=np.int64(_core.CONV_FORWARD),
        stride=ones,
        padding_lo=zeros,
        padding_hi=zeros,
        dilation=ones,
        groups=np.int64(groups),
        flags=np.int64(flags),
        algo_policy=np.int64(_core.ALGO_HEURISTIC),
        algo_id=np.int64(0),
        a_spec=order,
        b_spec=order,
        out_spec=order,
    )


def ffi_call(lib, x, w, groups=1, flags=-1):
    """One forward convolution through flux_dnn's XLA FFI handler on the shim at `lib`
    (registered with the handler under its file name, as flux_dnn.jax registers shims)."""
    jax = pytest.importorskip("jax")
    import flux_dnn.jax as fj

    if not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not built: {fj._ffi_state.get('reason')}")
    name = pathlib.Path(lib).stem
    assert fj._ffi_state["lib"].FluxDnnJaxRegisterShim(name.encode(), str(lib).encode()) == 0
    out = jax.ShapeDtypeStruct(x.shape[:1] + w.shape[:1] + x.shape[2:], x.dtype)
    return np.asarray(jax.ffi.ffi_call(fj._FFI_TARGET, out)(x, w, **ffi_attrs(name, groups, flags)))


def test_ffi_handler_passes_the_device_default_flags(tmp_path):
    lib = fake_shim(tmp_path, "fakeffi")
    x, w = np.zeros((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32)
    assert ffi_call(lib, x, w).flat[0] == 42  # the shim wrote y's first element
    assert counter(lib, "fake_last_flags", ctypes.c_uint32) == _core.CONV_ALLOW_REDUCED_PRECISION
    ffi_call(lib, x, w, flags=_core.CONV_DETERMINISTIC)  # the caller's own flags: another plan
    assert counter(lib, "fake_last_flags", ctypes.c_uint32) == _core.CONV_DETERMINISTIC
    created = counter(lib, "fake_plans_created")
    ffi_call(lib, x, w)
    assert counter(lib, "fake_plans_created") == created == 2  # both plans cached


def test_ffi_handler_checks_the_shim_and_maps_its_errors(tmp_path):
    jax = pytest.importorskip("jax")
    x, w = np.zeros((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32)
    incomplete = fake_shim(tmp_path, "ffiincomplete", "FAKE_NULL_CAPABILITIES")
    with pytest.raises(
        jax.errors.JaxRuntimeError,
        match=r"UNAVAILABLE: flux_dnn: shim .* has an incomplete function "
        r"table: Conv_Capabilities NULL",
    ):
        ffi_call(incomplete, x, w)
    lib = fake_shim(tmp_path, "ffierrors")
    for code, status in [
        (_core.ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (_core.ERROR_UNSUPPORTED, "UNIMPLEMENTED"),
        (_core.ERROR_UNAVAILABLE, "UNAVAILABLE"),
        (_core.ERROR_OUT_OF_MEMORY, "RESOURCE_EXHAUSTED"),
        (_core.ERROR_VENDOR, "INTERNAL"),
        (_core.ERROR_INTERNAL, "INTERNAL"),
    ]:
        with pytest.raises(
            jax.errors.JaxRuntimeError,
            match=rf"{status}: flux_dnn: \[ffierrors\] creating a plan: fake failure code {code}",
        ):
            ffi_call(lib, x, w, groups=1000 + code)


def test_ffi_handler_names_shims_by_registered_name():
    """A program names its shim by registered name and ABI major (portable across installs):
    an unknown name and another ABI major are refused with what to do."""
    jax = pytest.importorskip("jax")
    import flux_dnn.jax as fj

    if not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not built: {fj._ffi_state.get('reason')}")
    x, w = np.zeros((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32)
    call = jax.ffi.ffi_call(fj._FFI_TARGET, jax.ShapeDtypeStruct((1, 3, 4, 4), np.float32))
    with pytest.raises(jax.errors.JaxRuntimeError, match="UNAVAILABLE: flux_dnn: no flux_dnn shim named 'nosuch'"):
        call(x, w, **ffi_attrs("nosuch"))
    attrs = {**ffi_attrs("nosuch"), "abi_major": np.int64(_core.ABI_MAJOR + 1)}
    with pytest.raises(jax.errors.JaxRuntimeError, match=f"traced for flux_dnn ABI major {_core.ABI_MAJOR + 1}"):
        call(x, w, **attrs)


# -- a warm call allocates nothing in C++ -----------------------------------------------------

COUNTER_SETUP = r"""
import ctypes, sys
import numpy as np
import flux_dnn
from flux_dnn import _conv, _core

def count_in(library):
    counter = ctypes.CDLL(sys.argv[1])
    counter.alloc_counter_stop.restype = ctypes.c_long
    spans = [[int(v, 16) for v in line.split()[0].split("-")] for line in open("/proc/self/maps")
             if line.rstrip().endswith(library)]
    counter.alloc_counter_range(ctypes.c_size_t(min(s[0] for s in spans)), ctypes.c_size_t(max(s[1] for s in spans)))
    return counter

def allocations(call):
    for _ in range(3):
        call()  # plans made, buffers grown
    counter.alloc_counter_start()
    for _ in range(50):
        call()
    return counter.alloc_counter_stop()
"""

ALLOC_PROBE = (
    COUNTER_SETUP
    + r"""
counter = count_in(_core.__file__)
shim = _core.load_shim(sys.argv[2])
spec = _core.ConvSpec(_core.CONV_FORWARD, 2, [1, 1], [1, 1], [0, 0], [0, 0], 1)
x, w = np.zeros((1, 4, 8, 8), np.float32), np.zeros((4, 4, 3, 3), np.float32)
y = np.zeros((1, 4, 6, 6), np.float32)
packed = _core.PackedConv(shim, spec, x, w, y, None, None)
print(allocations(lambda: _core.run_conv(shim, spec, x, w, y, None, None, None)),
      allocations(lambda: packed.run(x, y, None, None, None)),
      allocations(lambda: flux_dnn.conv2d(x, w, out=y)))
"""
)


FFI_ALLOC_PROBE = (
    COUNTER_SETUP
    + r"""
import jax, flux_dnn.jax as fj
fj.ffi_available()
counter = count_in(fj._FFI_LIBRARY)
fj._ffi_state["lib"].FluxDnnJaxRegisterShim(b"fakewarm", sys.argv[2].encode())
order = np.arange(4, dtype=np.int64)
ones, zeros = np.ones(2, np.int64), np.zeros(2, np.int64)
out = jax.ShapeDtypeStruct((1, 3, 4, 4), np.float32)
conv = jax.jit(lambda x, w: jax.ffi.ffi_call(fj._FFI_TARGET, out)(
    x, w, shim="fakewarm", abi_major=np.int64(_core.ABI_MAJOR), op=np.int64(0), stride=ones, padding_lo=zeros,
    padding_hi=zeros, dilation=ones, groups=np.int64(1), flags=np.int64(-1), algo_policy=np.int64(0),
    algo_id=np.int64(0), a_spec=order, b_spec=order, out_spec=order))
x, w = jax.numpy.zeros((1, 2, 4, 4), np.float32), jax.numpy.ones((3, 2, 1, 1), np.float32)
print(allocations(lambda: conv(x, w).block_until_ready()))
"""
)


def count_allocations(tmp_path, probe):
    """Runs probe under an LD_PRELOAD malloc that counts the allocations whose call stack
    passes through the library the probe names; returns the probe's output."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the allocation counter is an LD_PRELOAD library for glibc")
    counter_lib = tmp_path / "liballoc_counter.so"
    subprocess.run(
        [
            compiler(),
            "-O1",
            "-shared",
            "-fPIC",
            str(pathlib.Path(__file__).with_name("alloc_counter.c")),
            "-o",
            str(counter_lib),
            "-ldl",
        ],
        check=True,
    )
    shim = fake_shim(tmp_path, "fakewarm")
    result = subprocess.run(
        [sys.executable, "-c", probe, str(counter_lib), str(shim)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LD_PRELOAD": str(counter_lib), "FLUX_DNN_SHIMS": str(shim)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_warm_call_allocates_nothing_in_core(tmp_path):
    """run_conv, a packed plan and flux_dnn.conv2d (on the fake shim) allocate nothing in C++
    once warm."""
    assert count_allocations(tmp_path, ALLOC_PROBE) == ["0", "0", "0"]


def test_a_warm_ffi_call_allocates_nothing_in_the_handler(tmp_path):
    pytest.importorskip("jax")
    import flux_dnn.jax as fj

    if not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not built: {fj._ffi_state.get('reason')}")
    assert count_allocations(tmp_path, FFI_ALLOC_PROBE) == ["0"]


@pytest.mark.parametrize("verification", ["never run on a GPU", "GPU check passed on an H200"])
def test_an_unverified_shim_warns_once_on_first_use_and_a_verified_one_never(monkeypatch, verification):
    from flux_dnn._discovery import _Entry, _warn_if_unverified

    monkeypatch.setenv("FLUX_DNN_UNVERIFIED_WARNING", "1")
    spec = flux_dnn.ShimSpec(name="vendorx", device_type=2, library="/nonexistent", verification=verification)
    entry = _Entry("vendorx", spec, None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _warn_if_unverified(entry)
        _warn_if_unverified(entry)  # the second use is silent
    said = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    if verification.startswith("never"):
        assert len(said) == 1 and "'vendorx' is unverified: never run on a GPU" in said[0], said
        assert "FLUX_DNN_UNVERIFIED_WARNING=0" in said[0]
    else:
        assert said == []


def test_the_unverified_warning_is_silenced_by_its_variable(monkeypatch):
    from flux_dnn._discovery import _Entry, _warn_if_unverified

    monkeypatch.setenv("FLUX_DNN_UNVERIFIED_WARNING", "0")
    spec = flux_dnn.ShimSpec(name="vendorx", device_type=2, library="/nonexistent", verification="never run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_unverified(_Entry("vendorx", spec, None))

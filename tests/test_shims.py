"""Shim discovery and loading: the ABI version check, failures recorded with their reason."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _core
from flux_dnn._discovery import REGISTRY

REPO = pathlib.Path(__file__).resolve().parent.parent
HEADER_DIR = REPO / "csrc" / "include"

# A shim that is complete in form but was "built" for ABI major 2: the core must refuse it.
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


def compile_shim(tmp_path, source, name):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a test shim")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    lib = tmp_path / f"lib{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", f"-I{HEADER_DIR}", str(src), "-o", str(lib)], check=True)
    return lib


def test_onednn_shim_is_listed_and_usable():
    status = {s.name: s for s in flux_dnn.shims()}
    onednn = status["onednn"]
    assert onednn.usable and onednn.loaded and onednn.found
    assert onednn.vendor == "oneDNN" and onednn.vendor_version_runtime.startswith("3.")
    assert onednn.device_type == 1 and onednn.num_devices == 1


def test_core_refuses_another_abi_major(tmp_path):
    lib = compile_shim(tmp_path, FOREIGN_SHIM, "foreign")
    major, minor = flux_dnn.ABI_VERSION
    with pytest.raises(flux_dnn.ShimLoadError,
                       match=rf"built for flux_dnn ABI {major + 1}\.3, but this flux_dnn core speaks ABI {major}\.{minor}"):
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
    (tmp_path / "broken_flux_plugin.py").write_text(textwrap.dedent("""
        from flux_dnn import ShimSpec
        def shim_spec():
            return ShimSpec(name="brokenrocm", device_type=10, library="/nonexistent/libflux_dnn_broken.so",
                            install_hint="pip install flux-dnn-rocm-fixed")
    """))
    dist = tmp_path / "broken_flux_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-flux-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[flux_dnn.shims]\nbrokenrocm = broken_flux_plugin:shim_spec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    REGISTRY.reset()
    yield
    REGISTRY.reset()


def test_failed_shim_is_listed_with_reason(broken_plugin):
    status = {s.name: s for s in flux_dnn.shims()}
    assert status["onednn"].usable  # one broken plugin does not break the others
    broken = status["brokenrocm"]
    assert broken.found and not broken.loaded and not broken.usable
    assert "cannot load shim library /nonexistent/libflux_dnn_broken.so" in broken.reason


def test_failed_shim_raises_only_when_its_device_is_asked_for(broken_plugin, rng):
    import numpy as np
    from test_errors import OtherDevice

    x = rng.standard_normal((1, 2, 5, 5), dtype=np.float32)
    w = rng.standard_normal((2, 2, 3, 3), dtype=np.float32)
    flux_dnn.conv2d(x, w)  # CPU unaffected
    with pytest.raises(flux_dnn.DeviceUnavailableError) as info:
        flux_dnn.conv2d(OtherDevice(x, (10, 0)), OtherDevice(w, (10, 0)))
    message = str(info.value)
    assert "ROCm" in message and "brokenrocm" in message and "/nonexistent/libflux_dnn_broken.so" in message
    assert "pip install flux-dnn-rocm-fixed" in message


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_import_loads_no_vendor_library():
    code = "import flux_dnn, pathlib; maps = pathlib.Path('/proc/self/maps').read_text(); print('dnnl' in maps, 'flux_dnn_onednn' in maps)"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_explicit_shim_selection_fails_loudly():
    code = "import numpy as np, flux_dnn; flux_dnn.conv2d(np.zeros((1,1,3,3),np.float32), np.zeros((1,1,3,3),np.float32))"
    result = run_python(code, FLUX_DNN_SHIMS="onednn,nosuchshim")
    assert result.returncode != 0
    assert "FLUX_DNN_SHIMS names 'nosuchshim', but no such shim is installed" in result.stderr
    assert run_python(code, FLUX_DNN_SHIMS="onednn").returncode == 0


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
    serving = result.stdout.split("CPU arrays:\n", 1)[1].splitlines()[:len(DTYPES)]
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
        np.testing.assert_allclose(y.astype(np.float64), ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1)),
                                   rtol=1e-2, atol=1e-2)
        if shim == "onednn":
            assert ("computed in float32" in plan.algorithm) == (how == "converted"), (dtype, plan.algorithm)
    assert {line.split()[0].rstrip(":") for line in serving} == set(DTYPES)

"""The cuDNN shim through flux_dnn itself, on a machine without an NVIDIA GPU (and with one):
the flux-dnn-cuda13 wheel registers the shim, flux_dnn finds and loads it and reports the
cuDNN version and why it cannot run; CPU convolutions are unaffected; a CUDA array is
refused with an error that names the device, the shim and the reason."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flux_dnn
from abi.fdnn_ctypes import ABI

cuda13 = pytest.importorskip(
    "flux_dnn_cuda13", reason="flux-dnn-cuda13 is not installed (pip install packaging/flux-dnn-cuda13)"
)


def cudnn_status():
    found = [s for s in flux_dnn.shims() if s.name == "cudnn"]
    assert len(found) == 1, [s.name for s in flux_dnn.shims()]
    return found[0]


def test_entry_point_spec_points_at_the_shim():
    spec = cuda13.shim_spec()
    assert isinstance(spec, flux_dnn.ShimSpec)
    assert (spec.name, spec.device_type) == ("cudnn", ABI.DEVICE_CUDA)
    assert spec.library.endswith("libflux_dnn_cudnn.so")
    assert "pip install flux-dnn-cuda13" in spec.install_hint


def test_shims_lists_cudnn_loaded_with_its_cudnn_version():
    s = cudnn_status()
    assert s.found and s.loaded, s.reason
    assert s.device_type == ABI.DEVICE_CUDA and s.vendor == "cuDNN"
    assert s.vendor_version_runtime.startswith("9."), s
    assert s.vendor_version_built.startswith("9.")


def test_without_a_gpu_the_reason_is_in_user_words():
    s = cudnn_status()
    if s.usable:
        pytest.skip("a CUDA device is present")
    assert s.num_devices == 0
    assert any(words in s.reason for words in ("no NVIDIA driver found", "no CUDA device", "driver is too old")), (
        s.reason
    )


def test_info_command_reports_the_shim():
    out = subprocess.run([sys.executable, "-m", "flux_dnn", "info"], capture_output=True, text=True, check=True).stdout
    block = out[out.index("shim cudnn") :]
    assert "[CUDA]" in block.splitlines()[0]
    assert "cuDNN 9." in block
    s = cudnn_status()
    if not s.usable:
        assert s.reason in block and "why not" in block


def test_cpu_convolution_still_works_with_the_cuda_wheel_installed(rng):
    cpu = [s for s in flux_dnn.shims() if s.device_type == ABI.DEVICE_CPU]
    if not any(s.usable for s in cpu):  # e.g. the GPU check machine, which lacks oneDNN
        pytest.skip(f"no usable CPU shim here: {[s.reason for s in cpu]}")
    x = rng.standard_normal((2, 3, 8, 8), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    y = flux_dnn.conv2d(x, w, padding=1)
    assert isinstance(y, np.ndarray) and y.shape == (2, 4, 8, 8)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = sum(
        np.einsum("nchw,kc->nkhw", xp[:, :, r : r + 8, s : s + 8], w[:, :, r, s]) for r in range(3) for s in range(3)
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


class CudaArrayStandIn:
    """Says it lives on cuda:0 and nothing more: dispatch must refuse it without reading
    its data (a plumbing check, not a GPU result)."""

    shape = (1, 1, 4, 4)
    ndim = 4
    dtype = np.dtype(np.float32)

    def __dlpack_device__(self):
        return (ABI.DEVICE_CUDA, 0)

    def __dlpack__(self, stream=None, **kwargs):
        raise AssertionError("the data of an unusable device must not be exported")


def test_cuda_array_without_a_gpu_names_device_shim_and_reason():
    s = cudnn_status()
    if s.usable:
        pytest.skip("a CUDA device is present")
    with pytest.raises(flux_dnn.DeviceUnavailableError) as err:
        flux_dnn.conv2d(CudaArrayStandIn(), CudaArrayStandIn())
    message = str(err.value)
    assert "CUDA" in message and "cudnn" in message and s.reason in message, message


def test_preload_loads_cudnn_and_its_companions_from_the_wheels():
    """The entry point's preload loads libcudnn.so.9 and, where NVIDIA's wheels are
    installed, cuBLASLt and NVRTC (cuDNN dlopens them by soname for some engines; off the
    library path they would be silently missing)."""
    wanted = [
        soname
        for soname, distributions in cuda13.COMPANIONS
        if any(cuda13.find_in_wheel(d, soname) for d in distributions)
    ]
    if cuda13.find_libcudnn() is None:
        pytest.skip("nvidia-cudnn-cu13 is not installed")
    code = "import flux_dnn_cuda13 as m; m._preload(); print(open('/proc/self/maps').read())"
    maps = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for soname in [cuda13.CUDNN_SONAME, *wanted]:
        assert soname in maps, f"{soname} not loaded by the preload"
    assert len(wanted) == 2 or not wanted, wanted  # both are nvidia-cudnn-cu13 dependencies


def _toolkit_include():
    """The CUDA toolkit's include folder (beside nvcc), or None."""
    import pathlib
    import shutil

    for nvcc in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if nvcc and pathlib.Path(nvcc).exists():
            for include in (
                pathlib.Path(nvcc).resolve().parent.parent / "include",
                pathlib.Path("/usr/local/cuda/include"),
            ):
                if (include / "cuda_runtime_api.h").exists():
                    return pathlib.Path(nvcc), include
    return None, None


def _run_selftest(command, binary):
    build = subprocess.run(command, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 0 and "ok" in run.stdout.splitlines()[-1], run.stdout


def test_epilogue_index_math_on_the_cpu(tmp_path):
    """epilogue.cu's walks (bias/activation over every layout, in memory order for dense
    NCHW/NHWC; the bias gradient's per-thread shares over chunks and lanes; the staging copy's
    zero-padding and crop), run on the CPU by csrc/shims/cudnn/epilogue_selftest.cu: the
    kernels' own index code, no GPU needed."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    nvcc, _ = _toolkit_include()
    if nvcc is None:
        pytest.skip("nvcc not found (the CUDA toolkit builds the cuDNN shim)")
    binary = tmp_path / "epilogue_selftest"
    source = root / "csrc/shims/cudnn/epilogue_selftest.cu"
    _run_selftest([str(nvcc), "-std=c++17", "-I", str(root / "csrc/include"), "-o", str(binary), str(source)], binary)


def test_plan_time_decisions_on_the_cpu(tmp_path):
    """What the shim decides before any cuDNN call, run on the CPU by
    csrc/shims/cudnn/host_selftest.cpp: workspace_size never above workspace_limit (parts
    aligned, not overlapping, staged x, w and y included) at every limit around the
    boundaries; channels-last seen with one channel or width 1; size-1 strides canonical; w
    staged only when its order differs, and given to cuDNN as it is in the no-scratch variant;
    the staged problem (x padded by the difference of asymmetric paddings, dx cropped, views
    with gaps or stride 0 compacted, cuDNN padding min(lo, hi)); alignment per tensor."""
    import pathlib
    import shutil

    root = pathlib.Path(__file__).resolve().parent.parent
    _, cuda_include = _toolkit_include()
    compiler = shutil.which("c++") or shutil.which("g++")
    header = cuda13.find_in_wheel(cuda13.CUDNN_DISTRIBUTION, "cudnn_graph.h")
    if cuda_include is None or compiler is None or header is None:
        pytest.skip("needs the CUDA toolkit's headers, a C++ compiler and nvidia-cudnn-cu13's headers")
    cudnn = root / "csrc/shims/cudnn"
    binary = tmp_path / "host_selftest"
    command = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror"]
    command += ["-I", str(root / "csrc/include"), "-I", str(root / "csrc/shims/common"), "-I", str(cudnn)]
    command += ["-isystem", str(header.parent), "-isystem", str(cuda_include)]
    command += [
        str(cudnn / "host_selftest.cpp"),
        str(cudnn / "problem.cpp"),
        str(root / "csrc/shims/common/shim_common.cpp"),
    ]
    _run_selftest([*command, "-o", str(binary), "-lpthread"], binary)

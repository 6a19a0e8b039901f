"""A program saved with jax.export runs from another install: the custom call names its shim by
registered name and ABI major, never by the path of this install's library."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flux_dnn  # noqa: E402
import flux_dnn.jax as fj  # noqa: E402
from flux_dnn import _core  # noqa: E402

INSTALLED = pathlib.Path(flux_dnn.__file__).resolve().parent


@pytest.fixture(autouse=True)
def ffi(monkeypatch):
    if not fj.ffi_available():
        pytest.skip(f"the XLA FFI handler is not installed: {fj._ffi_state.get('reason')}")
    monkeypatch.setattr(fj, "_BACKEND", "ffi")
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def model(x, w):
    """A forward convolution, a transposed one (lhs dilation) and a gradient (backward-data and
    backward-weight): every op of the handler."""
    y = fj.conv_general_dilated(x, w, (2, 1), ((1, 2), (0, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
    z = fj.conv_general_dilated(y, w, (1, 1), ((2, 1), (1, 1)), (2, 1), dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (
        z.sum()
        + jax.grad(
            lambda w: (
                fj.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2
            ).sum()
        )(w).sum()
    )


def exported_program(rng):
    x = jnp.asarray(rng.standard_normal((2, 9, 8, 4)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((3, 2, 4, 4)).astype(np.float32))
    exported = jax.export.export(jax.jit(model), disabled_checks=fj.EXPORT_CHECKS)(x, w)
    return exported, (np.asarray(x), np.asarray(w)), float(jax.jit(model)(x, w))


def test_the_program_names_no_path(rng):
    exported, _, _ = exported_program(rng)
    calls = re.findall(rf"custom_call @{fj._FFI_TARGET}\(.*?\) \{{(.*?)\}} :", exported.mlir_module())
    assert len(calls) == 4, calls  # forward, backward-data, forward and backward-weight of the gradient
    for attributes in calls:  # (the module's debug locations name source files, which is no matter)
        assert 'shim = "onednn"' in attributes and f"abi_major = {_core.ABI_MAJOR}" in attributes, attributes
        assert str(INSTALLED) not in attributes and ".so" not in attributes, attributes


def another_install(root: pathlib.Path) -> pathlib.Path:
    """A new venv whose site-packages links to this one's packages, except flux_dnn and the
    XLA FFI handler's package, which are copied: flux_dnn installed at another path. Returns
    its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    here = pathlib.Path(sysconfig.get_paths()["purelib"])
    python = root / "bin" / "python"
    there = pathlib.Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    if INSTALLED.parent != here:
        pytest.skip(f"flux_dnn is not installed in this interpreter's site-packages ({INSTALLED})")
    for entry in here.iterdir():
        if entry.name.startswith(("flux_dnn", "flux-dnn")):
            copy = shutil.copytree if entry.is_dir() else shutil.copy2
            copy(entry, there / entry.name)
        else:
            (there / entry.name).symlink_to(entry)
    for entry in pathlib.Path(sys.prefix, "lib").iterdir():  # wheels' data files (oneDNN's library)
        if not entry.name.startswith("python") and not (root / "lib" / entry.name).exists():
            (root / "lib" / entry.name).symlink_to(entry)
    return python


def test_an_exported_program_runs_from_another_install(rng, tmp_path):
    pytest.importorskip("flatbuffers", reason="jax.export's serialization needs flatbuffers (a test extra)")
    exported, (x, w), want = exported_program(rng)
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    python = another_install(tmp_path / "venv")
    code = textwrap.dedent(
        """
        import pathlib, sys
        import jax, numpy as np
        import flux_dnn, flux_dnn.jax as fj
        assert fj.ffi_available(), fj._ffi_state  # registers the handler and this install's shims
        here = pathlib.Path(sys.argv[1])
        program = jax.export.deserialize(bytearray((here / "program.bin").read_bytes()))
        print(float(program.call(np.load(here / "x.npy"), np.load(here / "w.npy"))))
        print(flux_dnn.__file__)
        print(fj._FFI_LIBRARY)
        print("\\n".join(sorted({line.split()[-1] for line in open("/proc/self/maps") if "libflux_dnn" in line})))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLUX_DNN_SHIMS", "FLUX_DNN_JAX_FFI")}
    out = subprocess.run(
        [str(python), "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    value, module, handler, *libraries = out.stdout.splitlines()
    assert abs(float(value) - want) <= 1e-4 * max(1.0, abs(want)), (value, want)
    venv = str((tmp_path / "venv").resolve())
    assert module.startswith(venv) and handler.startswith(venv), (module, handler)
    assert libraries and all(lib.startswith(venv) for lib in libraries), libraries  # none from this install
    assert any("libflux_dnn_onednn" in lib for lib in libraries), libraries

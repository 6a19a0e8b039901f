"""The shim libraries the ABI suite checks (conftest.py gives each to the `shim` fixture).

A test with a `shim` argument runs once per library found here, without naming any:
  - every shim the installed packages register (entry points of group flux_dnn.shims, as
    flux_dnn itself finds them: flux_dnn's own shims and plug-in wheels such as
    flux-dnn-cuda13), loaded after the entry point's own preload of its vendor libraries;
  - the MIOpen shim (flux-dnn-rocm) on the MIOpen test double, tests/doubles/miopen, unless
    FLUX_DNN_MIOPEN_REAL=1 (an AMD machine);
  - any library named by FLUX_DNN_<NAME>_SHIM (it replaces the registered shim of that name);
  - tests/fake_shim.c built complete (FAKE_COMPLETE), once usable ("fake") and once
    reporting itself unavailable ("fake_unavailable"), when a C compiler is here: a shim with
    no vendor, so that every machine checks the suite itself, the usable and the unusable path.
A shim whose vendor library or device is absent here is still loaded: the tests that need no
device run, and the rest skip with the reason the shim gives."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
from collections.abc import Callable

import pytest

import flux_dnn
from doubles import miopen as miopen_double  # tests/ is on sys.path (tests/conftest.py)
from flux_dnn import _core

from . import fdnn_ctypes as F

FAKE_SOURCE = pathlib.Path(__file__).resolve().parent.parent / "fake_shim.c"
# The header of the installed flux_dnn, the one its _core and shims were built from.
INCLUDE_DIR = pathlib.Path(flux_dnn.get_include())
ENTRY_POINT_GROUP = "flux_dnn.shims"  # the plug-in contract: where every package registers its shims


@dataclasses.dataclass(frozen=True)
class ShimSource:
    """Where the suite found one shim library, and how to open it."""

    name: str
    origin: str  #: in words: "entry point flux_dnn._onednn:shim_spec", "FLUX_DNN_BLAS_SHIM", ...
    library: str = ""  #: its path; "" for a fake not built yet
    preload: Callable[[], None] | None = None  #: the entry point's preload of vendor libraries
    defines: tuple = ()  #: a fake: the -D options it is built with
    missing: str = ""  #: why there is no library to test, when there is none


def _registered() -> list:
    """The shims the installed packages register, as flux_dnn's registry reads them."""
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {ep.value}"
        try:
            spec = ep.load()()
        except Exception as exc:  # noqa: BLE001 -- reported as the reason it is not tested
            found.append(ShimSource(ep.name, origin, missing=f"its entry point failed: {exc}"))
            continue
        library = os.fspath(spec.library)
        missing = "" if os.path.exists(library) else f"its library {library} is not there (a build without it)"
        if missing and spec.preload is not None:
            try:  # a shim of another platform (the MPS shim off macOS) says why in its preload
                spec.preload()
            except Exception as exc:  # noqa: BLE001 -- reported as the reason it is not tested
                missing = f"{exc} ({missing})"
        found.append(ShimSource(spec.name, origin, library, spec.preload, missing=missing))
    return found


def _fakes() -> list:
    common = (
        "FAKE_COMPLETE",
        f'FAKE_SHIM_VERSION="{_core.__version__}"',
        "FAKE_PRIORITY=FDNN_PRIORITY_PORTABLE",
        "FAKE_DEFAULT_FLAGS=0",
    )
    return [
        ShimSource("fake", "tests/fake_shim.c", defines=common + ('FAKE_NAME="fake"',)),
        ShimSource(
            "fake_unavailable",
            "tests/fake_shim.c",
            defines=common + ('FAKE_NAME="fake_unavailable"', 'FAKE_UNAVAILABLE="a fake with no device"'),
        ),
    ]


def shim_sources() -> dict:
    """{name: ShimSource} of every shim the suite checks."""
    found = {s.name: s for s in _registered()}
    for key, value in sorted(os.environ.items()):
        m = re.fullmatch(r"FLUX_DNN_(\w+)_SHIM", key)
        if m and value:
            name = m.group(1).lower()
            registered = found.get(name)
            found[name] = ShimSource(
                name,
                key,
                value,
                registered.preload if registered else None,
                missing="" if os.path.exists(value) else f"{key}={value} does not exist",
            )
    for fake in _fakes():
        found[fake.name] = fake
    return found


SOURCES = shim_sources()


def compile_fake(directory: pathlib.Path, name: str, *defines: str) -> str:
    """tests/fake_shim.c built with -D options into directory/lib<name>.so; skips when no C
    compiler is here."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler here to build tests/fake_shim.c")
    library = directory / f"lib{name}.so"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{INCLUDE_DIR}",
            *(f"-D{d}" for d in defines),
            str(FAKE_SOURCE),
            "-o",
            str(library),
        ],
        check=True,
    )
    return str(library)


@functools.cache
def _opened(name: str, build_dir: pathlib.Path) -> F.Shim:
    source = SOURCES[name]
    library = source.library or compile_fake(build_dir, name, *source.defines)
    if name == "miopen" and miopen_double.wanted():
        # No AMD GPU or MIOpen here: the shim runs on the test double (tests/doubles/miopen),
        # which checks its plumbing against MIOpen's contracts (FLUX_DNN_MIOPEN_REAL=1: not).
        miopen_double.build_or_skip(build_dir / "miopen_double")  # no C++ compiler: skip
        miopen_double.use(build_dir / "miopen_double")
    if source.preload is not None:
        try:
            source.preload()
        except Exception:  # noqa: BLE001 -- a missing vendor library: the shim must say so itself
            pass
    shim = F.Shim(library)
    shim.source = source
    return shim


def open_shim(name: str, tmp_path_factory) -> F.Shim:
    """The shim `name` of SOURCES, opened once per session; skips when it has no library."""
    source = SOURCES.get(name)
    if source is None:
        pytest.skip(
            f"no shim {name!r} here (installed: {', '.join(sorted(SOURCES))}; or set "
            f"FLUX_DNN_{name.upper()}_SHIM to its library)"
        )
    if source.missing:
        pytest.skip(f"shim {name} ({source.origin}): {source.missing}")
    return _opened(name, tmp_path_factory.getbasetemp())

"""The `shim` fixture: every test of this folder that takes it runs once per shim library
that shims.py finds (installed, named by FLUX_DNN_<NAME>_SHIM, or the fake shim built here),
without naming any."""

from __future__ import annotations

import pytest

from . import fdnn_ctypes as F
from .shims import SOURCES, open_shim


def pytest_generate_tests(metafunc):
    if "shim" in metafunc.fixturenames:
        metafunc.parametrize("shim", sorted(SOURCES), indirect=True, scope="session")


@pytest.fixture(scope="session")
def shim(request, tmp_path_factory) -> F.Shim:
    return open_shim(request.param, tmp_path_factory)

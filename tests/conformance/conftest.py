"""Backends of the conformance suite, how a test is pinned to one, and what a shim claims.

A backend is one usable shim (from ``flux_dnn.shims()``: discovered, never named here) with
one array library that holds its device's arrays (libraries.py). A test that takes the
``backend`` fixture is generated once per backend, crossed with the axes its
``@pytest.mark.matrix(...)`` marker lists (``libraries="first"`` keeps one library per shim
for tests whose subject is not the array library; ``where=`` keeps the libraries a test
concerns, such as those with streams). A shim that is not usable here, or a
library that is missing, gives one skipped test with the reason instead of a whole row.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import os

import pytest

import flux_dnn
from flux_dnn import _core

from .libraries import CPU, LAYOUTS, all_libraries
from .rocm_host import use_double_if_wanted

# The MIOpen shim (flux-dnn-rocm) runs on its test double here, before any shim is loaded:
# no AMD GPU or MIOpen is needed, and FLUX_DNN_MIOPEN_REAL=1 leaves a real MIOpen in charge.
use_double_if_wanted()

DTYPES = ("float64", "float32", "float16", "bfloat16")
RANKS = (1, 2, 3)
#: The ops as the suite drives them through the public API.
OPS = ("forward", "plan", "backward_data", "backward_weight", "backward_weight_bias", "transposed")
#: The ABI op each of them runs as (conv_transpose is the backward-data of a convolution).
ABI_OP = {
    "forward": _core.CONV_FORWARD,
    "plan": _core.CONV_FORWARD,
    "backward_data": _core.CONV_BACKWARD_DATA,
    "transposed": _core.CONV_BACKWARD_DATA,
    "backward_weight": _core.CONV_BACKWARD_WEIGHT,
    "backward_weight_bias": _core.CONV_BACKWARD_WEIGHT,
}
#: flux_dnn's activation names and the ABI's codes for them.
ACTIVATION_CODES = {
    "relu": _core.ACTIVATION_RELU,
    "leaky_relu": _core.ACTIVATION_LEAKY_RELU,
    "clip": _core.ACTIVATION_CLIP,
    "sigmoid": _core.ACTIVATION_SIGMOID,
    "tanh": _core.ACTIVATION_TANH,
    "gelu_tanh": _core.ACTIVATION_GELU_TANH,
    "gelu": _core.ACTIVATION_GELU_ERF,
    "silu": _core.ACTIVATION_SILU,
}
#: The feature bits of ABI 2.0 (_core.FEATURE_<NAME>), by the suite's lower-case names.
FEATURES = (
    "groups",
    "dilation",
    "alpha_beta",
    "bias_gradient",
    "asymmetric_padding",
    "pack_weights",
    "deterministic",
    "benchmark",
    "reduced_precision",
)


# ------------------------------------------------------------------------------------------
# What a shim claims


@dataclasses.dataclass(frozen=True)
class Capability:
    """What a shim reports it does for one op and dtype on one device."""

    support: str  #: "native", "converted" or "none"
    ranks: frozenset  #: spatial ranks served
    activations: frozenset  #: flux_dnn activation names fused (forward)
    features: frozenset  #: names from FEATURES
    detail: str  #: the shim's words: how, or why not

    @property
    def computes(self) -> bool:
        return self.support != "none"


def _bits(mask: int, codes: dict) -> frozenset:
    return frozenset(name for name, code in codes.items() if mask & (1 << code))


def shim_capabilities(shim, op: int, dtype: str, device_id: int = 0) -> Capability:
    """What `shim` (a loaded ``_core.Shim``) says it does for ABI `op` and `dtype` (ABI 2.0's
    Conv_Capabilities): the one place the suite asks a shim."""
    raw = shim.capabilities(op, dtype, device_id)
    support = {_core.SUPPORT_NATIVE: "native", _core.SUPPORT_CONVERTED: "converted"}.get(raw["support"], "none")
    features = frozenset(name for name in FEATURES if raw["features"] & getattr(_core, "FEATURE_" + name.upper()))
    return Capability(
        support,
        frozenset(RANKS) & frozenset(raw["spatial_ranks"]),
        _bits(raw["activations"], ACTIVATION_CODES),
        features,
        raw["detail"] or "",
    )


# ------------------------------------------------------------------------------------------
# Pinning a test to one shim


class ShimPin:
    """Test pinning: the dispatcher picks a shim by itself, so to test one shim the suite
    lets flux_dnn see only that one, through the user's own switch FLUX_DNN_SHIMS (re-read
    when the registry rediscovers). Not a stand-in for anything under test: the calls still
    go through flux_dnn's dispatch, plan cache and the shim. The pin changes only when the
    next test wants another shim, and the user's setting comes back when the suite ends."""

    VARIABLE = "FLUX_DNN_SHIMS"

    def __init__(self):
        self._ambient = os.environ.get(self.VARIABLE)
        self.current: str | None = None

    def pin(self, selector: str) -> None:
        if selector != self.current:
            self._select(selector)
            self.current = selector

    def release(self) -> None:
        self._select(self._ambient)
        self.current = None

    def _select(self, value: str | None) -> None:
        if value is None:
            os.environ.pop(self.VARIABLE, None)
        else:
            os.environ[self.VARIABLE] = value
        from flux_dnn import _conv
        from flux_dnn._discovery import REGISTRY

        REGISTRY.reset()  # rediscovery reads FLUX_DNN_SHIMS again
        # A remembered call pattern holds the shim it was dispatched to: forget them all.
        _conv._memo.clear()


@pytest.fixture(scope="package")
def shim_pin():
    pin = ShimPin()
    yield pin
    pin.release()


# ------------------------------------------------------------------------------------------
# Backends


def _entry_point_names() -> set:
    from flux_dnn._discovery import ENTRY_POINT_GROUP

    return {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


@dataclasses.dataclass
class BackendParam:
    """One generated backend: a shim status, a library, or why this pair cannot run here."""

    status: object  # flux_dnn.ShimStatus
    library: object = None
    skip: str | None = None
    selector: str = ""  # what FLUX_DNN_SHIMS names to pin this shim

    @property
    def id(self) -> str:
        return f"{self.status.name}-{self.library.name if self.library else 'none'}"


_BACKENDS: list | None = None


def discovered_backends() -> list:
    """Every (shim, library) pair, in flux_dnn.shims() order; computed once per session."""
    global _BACKENDS
    if _BACKENDS is None:
        names = _entry_point_names()
        libraries = all_libraries()
        found = []
        for status in flux_dnn.shims():
            selector = status.name if status.name in names else status.path
            if not status.usable:
                found.append(
                    BackendParam(
                        status,
                        skip=f"shim {status.name!r} ({status.device}) is not usable here: {status.reason}",
                        selector=selector,
                    )
                )
                continue
            held = [lib for lib in libraries if lib.device_type == status.device_type]
            if not held:
                found.append(
                    BackendParam(
                        status,
                        skip=f"no array library known to the suite holds {status.device} arrays",
                        selector=selector,
                    )
                )
            for lib in held:
                reason = lib.unavailable()
                found.append(BackendParam(status, lib, reason and f"{lib.name} ({status.device}): {reason}", selector))
        _BACKENDS = found
    return _BACKENDS


def _axis_id(name: str, value) -> str:
    if name == "nd":
        return f"{value}d"
    if isinstance(value, tuple):
        return "_".join(map(str, value))
    return str(value)


def _exists(library, axes: dict) -> bool:
    """Whether a case exists at all for the library: JAX arrays have no channels-last form
    (no strides), so those cases are not generated rather than skipped."""
    return axes.get("layout", "contiguous") == "contiguous" or library.strided


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "matrix(libraries='all'|'first', where=None, **axes): the axes a "
        "conformance test is generated over, per backend; 'first' keeps one "
        "library per shim, where(library) which libraries the test concerns",
    )
    config.addinivalue_line("markers", "accelerator: a conformance test on a device other than the CPU")


def _chosen_backends(first_only: bool, where) -> list:
    """The backends a test concerns (where(library)); with first_only, per shim the first
    that can run here, else the first that cannot (its skip reason)."""

    def concerned(b):
        if where is None:
            return True
        if b.library is not None:
            return where(b.library)
        # a shim that cannot run here: shown where a library of its device would be concerned
        return any(where(lib) for lib in all_libraries() if lib.device_type == b.status.device_type)

    chosen = [b for b in discovered_backends() if concerned(b)]
    if not first_only:
        return chosen
    per_shim: dict = {}
    for b in chosen:
        kept = per_shim.get(b.status.name)
        if kept is None or (kept.skip is not None and b.skip is None):
            per_shim[b.status.name] = b
    return list(per_shim.values())


# Known gaps of one shim that its capabilities cannot express, as strict xfails: the case still
# runs (so a fix shows as an unexpected pass and fails the run), and the reason is written once
# here, not in a CI script. Key: (shim, test function); value: (axes that fail, reason).
KNOWN_SHIM_GAPS = {
    ("miopen", "test_results_are_rounded_once"): (
        lambda axes: axes.get("dtype") in ("float16", "bfloat16"),
        "MIOpen writes a 16-bit convolution in the output dtype and beta accumulates onto that "
        "rounded value: float16/bfloat16 results with beta != 0 are rounded twice (README, AMD GPUs)",
    ),
}


def _known_gap_marks(shim: str, test_name: str, axes: dict) -> list:
    gap = KNOWN_SHIM_GAPS.get((shim, test_name))
    if gap is None or not gap[0](axes):
        return []
    return [pytest.mark.xfail(reason=gap[1], strict=True)]


def pytest_generate_tests(metafunc):
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("matrix")
    axes = dict(marker.kwargs) if marker else {}
    first_only = axes.pop("libraries", "all") == "first"
    where = axes.pop("where", None)
    params = []
    for b in _chosen_backends(first_only, where):
        marks = [pytest.mark.accelerator] if b.status.device_type != CPU else []
        if b.skip is not None:
            skip = pytest.mark.skip(reason=b.skip)
            params.append(pytest.param(b, *[None] * len(axes), id=b.id, marks=[*marks, skip]))
            continue
        for combo in itertools.product(*axes.values()):
            if not _exists(b.library, dict(zip(axes, combo))):
                continue
            ids = [b.id, *(_axis_id(n, v) for n, v in zip(axes, combo))]
            gaps = _known_gap_marks(b.status.name, metafunc.definition.originalname, dict(zip(axes, combo)))
            params.append(pytest.param(b, *combo, id="-".join(ids), marks=[*marks, *gaps]))
    if not params:
        what = getattr(where, "__doc__", None) or "one this test concerns"
        params.append(
            pytest.param(
                None,
                *[None] * len(axes),
                id="none",
                marks=pytest.mark.skip(reason=f"no backend here has a library {what}"),
            )
        )
    metafunc.parametrize(["backend", *axes], params, indirect=["backend"])


class Backend:
    """The shim and array library a test runs on, and what the shim claims there."""

    def __init__(self, param: BackendParam):
        self.status = param.status
        self.shim = param.status.name
        self.selector = param.selector
        self.lib = param.library
        self._loaded = _core.load_shim(param.status.path)  # the same library flux_dnn loaded
        self._caps: dict = {}

    def __repr__(self):
        return f"{self.shim} on {self.lib!r}"

    def capability(self, op: str, dtype: str) -> Capability:
        key = (op, dtype)
        if key not in self._caps:
            self._caps[key] = shim_capabilities(self._loaded, ABI_OP[op], dtype)
        return self._caps[key]

    def require_array(self, dtype: str, layout: str = "contiguous") -> None:
        """Skips when the array library cannot hold `dtype` in `layout`."""
        reason = self.lib.missing_dtype(dtype) or self.lib.missing_layout(layout)
        if reason:
            pytest.skip(reason)

    def require(
        self, op: str, dtype: str, nd: int | None = None, activation=None, features=(), layout: str = "contiguous"
    ) -> Capability:
        """What the shim claims for op and dtype; skips, in the shim's words, when it does not
        claim the dtype, the rank, the activation or one of the features."""
        self.require_array(dtype, layout)
        cap = self.capability(op, dtype)
        said = f": {cap.detail}" if cap.detail else ""
        if not cap.computes:
            pytest.skip(f"shim {self.shim!r} does not compute {dtype} for {op}{said}")
        if nd is not None and nd not in cap.ranks:
            pytest.skip(f"shim {self.shim!r} does not claim {nd}-D {op} in {dtype}{said}")
        name = activation if isinstance(activation, str) or activation is None else activation[0]
        if name is not None and name not in cap.activations:
            pytest.skip(f"shim {self.shim!r} does not claim a fused {name} for {op} in {dtype}{said}")
        missing = [f for f in features if f not in cap.features]
        if missing:
            pytest.skip(f"shim {self.shim!r} does not claim {', '.join(missing)} for {op} in {dtype}{said}")
        return cap

    def dtypes(self, op: str) -> list:
        """The dtypes the shim claims for op that the library holds."""
        return [d for d in DTYPES if self.capability(op, d).computes and self.lib.missing_dtype(d) is None]

    def some_dtype(self, op: str, rng, prefer=None) -> str:
        """`prefer` when claimed and held, else a random claimed one; skips when there is none."""
        claimed = self.dtypes(op)
        if not claimed:
            pytest.skip(f"shim {self.shim!r} computes no dtype {self.lib.name} holds for {op}")
        return prefer if prefer in claimed else str(rng.choice(claimed))

    def layouts(self) -> list:
        return [layout for layout in LAYOUTS if self.lib.missing_layout(layout) is None]


@pytest.fixture
def backend(request, shim_pin):
    param: BackendParam = request.param
    if param.skip is not None:  # (marked skip already; kept for direct use)
        pytest.skip(param.skip)
    shim_pin.pin(param.selector)
    param.library.load()
    with param.library.context():
        yield Backend(param)

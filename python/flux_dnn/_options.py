"""The keyword options of a convolution op as one frozen, validated, hashable object.

Every op (``conv``, ``conv_backward_data``, ``conv_backward_weight``, ``conv_transpose``,
``conv_plan``) turns its keyword arguments into one :class:`ConvOptions` at the call, which
then travels alone through the layers below. Equal keywords give one shared object (the
options are interned), so a repeated call validates nothing and hashes a cached number.

The names ("relu", "heuristic", ...) and the number of parameters of each activation are
Python's; every number sent to a shim is read from ``_core``, which takes it from flux_dnn.h.
"""

from __future__ import annotations

import dataclasses

from . import _core
from ._geometry import as_int

# name: (ABI code, number of parameters)
ACTIVATIONS = {
    "relu": (_core.ACTIVATION_RELU, 0),
    "leaky_relu": (_core.ACTIVATION_LEAKY_RELU, 1),  # ("leaky_relu", negative_slope)
    "clip": (_core.ACTIVATION_CLIP, 2),  # ("clip", lo, hi); ("clip", 0, 6) is relu6
    "sigmoid": (_core.ACTIVATION_SIGMOID, 0),
    "tanh": (_core.ACTIVATION_TANH, 0),
    "gelu_tanh": (_core.ACTIVATION_GELU_TANH, 0),
    "gelu": (_core.ACTIVATION_GELU_ERF, 0),  # exact (erf)
    "silu": (_core.ACTIVATION_SILU, 0),
}
_LEAKY_RELU_SLOPE = 0.01  # PyTorch's default negative_slope

ALGORITHM_POLICIES = {"heuristic": _core.ALGO_HEURISTIC, "benchmark": _core.ALGO_BENCHMARK}

# Which keywords each op takes (besides out=, an array, which is not an option).
_COMMON = ("alpha", "beta", "deterministic", "allow_reduced_precision", "algorithm", "workspace_limit")
KEYWORDS = {
    "conv": ("activation", *_COMMON),
    "conv_backward_data": _COMMON,
    "conv_backward_weight": ("bias_grad", *_COMMON),
    "conv_transpose": _COMMON,
    "conv_plan": ("activation", *(k for k in _COMMON if k != "beta")),
}
_TAKES_OUT = {"conv", "conv_backward_data", "conv_backward_weight", "conv_transpose"}


def _flag(value, name: str) -> bool:
    if value not in (True, False):  # also NumPy's bools and 0/1, which compare equal
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def _real(value, name: str) -> float:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {value!r}") from None


def _activation(activation) -> tuple | None:
    """None, or (name, *float parameters) with every parameter given."""
    if activation is None:
        return None
    if isinstance(activation, str):
        name, params = activation, ()
    elif isinstance(activation, (tuple, list)) and activation and isinstance(activation[0], str):
        name, params = activation[0], tuple(activation[1:])
    else:
        raise ValueError(f"activation: expected None, a name or (name, *parameters), got {activation!r}")
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    count = ACTIVATIONS[name][1]
    if len(params) not in ((count,) if name != "leaky_relu" else (0, 1)):
        raise ValueError(f"activation: {name!r} takes {count} parameter(s), got {activation!r}")
    if name == "leaky_relu" and not params:
        params = (_LEAKY_RELU_SLOPE,)
    return (name, *(_real(p, f"activation: {name!r} parameter") for p in params))


def _algorithm(algorithm) -> str | int:
    if isinstance(algorithm, str):
        if algorithm not in ALGORITHM_POLICIES:
            raise ValueError(f"algorithm: expected 'heuristic', 'benchmark' or an algorithm id, got {algorithm!r}")
        return algorithm
    return as_int(algorithm, "algorithm")


def _workspace_limit(limit) -> int | None:
    if limit is None:
        return None
    limit = as_int(limit, "workspace_limit")
    if limit < 0:
        raise ValueError(f"workspace_limit: expected None or a number of bytes >= 0, got {limit}")
    return limit


@dataclasses.dataclass(frozen=True, slots=True)
class ConvOptions:
    """The keyword options of one op, checked and in one form (``"leaky_relu"`` becomes
    ``("leaky_relu", 0.01)``, numbers become floats)."""

    activation: tuple | None = None
    alpha: float = 1.0
    beta: float = 0.0
    deterministic: bool = False
    #: None: the device's default (the shim's default_flags: TF32 on NVIDIA, off on CPUs)
    allow_reduced_precision: bool | None = None
    algorithm: str | int = "heuristic"
    workspace_limit: int | None = None
    bias_grad: bool = False
    # The hash, computed once: the options are part of the key of every memoised call.
    _hash: int = dataclasses.field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self):
        checked = {
            "activation": _activation(self.activation),
            "alpha": _real(self.alpha, "alpha"),
            "beta": _real(self.beta, "beta"),
            "deterministic": _flag(self.deterministic, "deterministic"),
            "allow_reduced_precision": None
            if self.allow_reduced_precision is None
            else _flag(self.allow_reduced_precision, "allow_reduced_precision"),
            "algorithm": _algorithm(self.algorithm),
            "workspace_limit": _workspace_limit(self.workspace_limit),
            "bias_grad": _flag(self.bias_grad, "bias_grad"),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_hash", hash(tuple(checked.values())))

    def __hash__(self) -> int:
        return self._hash

    # -- the numbers of the ABI (slow path: once per call pattern) --------------------------

    def activation_code(self) -> tuple:
        """(FDNN_ACTIVATION_*, activation_alpha, activation_beta)."""
        if self.activation is None:
            return _core.ACTIVATION_NONE, 0.0, 0.0
        name, *params = self.activation
        params += [0.0, 0.0]
        return ACTIVATIONS[name][0], params[0], params[1]

    def algorithm_policy(self) -> tuple:
        """(FDNN_ALGO_*, algo_id)."""
        if isinstance(self.algorithm, str):
            return ALGORITHM_POLICIES[self.algorithm], 0
        return _core.ALGO_GIVEN, self.algorithm

    def flags(self, default_flags: int) -> int:
        """The FDNN_CONV_* flags: the device's defaults, with what these options ask for
        (deterministic=True sets its bit; allow_reduced_precision True/False sets/clears its
        bit, None keeps the device's choice)."""
        flags = default_flags
        if self.deterministic:
            flags |= _core.CONV_DETERMINISTIC
        if self.allow_reduced_precision is not None:
            flags &= ~_core.CONV_ALLOW_REDUCED_PRECISION
            if self.allow_reduced_precision:
                flags |= _core.CONV_ALLOW_REDUCED_PRECISION
        return flags


DEFAULT = ConvOptions()
# Equal options are one object (memo keys holding them then compare by identity first), and
# each op's keyword arguments, by value and type, map to theirs: a repeated call builds none.
_canonical: dict = {DEFAULT: DEFAULT}
_by_keywords: dict = {}
_INTERN_LIMIT = 1024


def options(op: str, kwargs: dict) -> tuple:
    """(ConvOptions, out) from an op's keyword arguments (kwargs is the call's own dict and is
    consumed). TypeError for a keyword the op does not take; ValueError for beta without out."""
    out = kwargs.pop("out", None) if op in _TAKES_OUT else None
    found = _interned(op, kwargs) if kwargs else DEFAULT
    if out is None and found.beta != 0.0:
        raise ValueError(f"beta: beta={found.beta!r} accumulates into an existing output, so it needs out=")
    return found, out


def _interned(op: str, kwargs: dict) -> ConvOptions:
    try:  # the types too: True == 1, but algorithm=True is refused where algorithm=1 is not
        key = (op, tuple(kwargs.items()), tuple(map(type, kwargs.values())))
        return _by_keywords[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable value (a list): checked on every call
        return _build(op, kwargs)
    if len(_by_keywords) >= _INTERN_LIMIT:
        _by_keywords.clear()
        _canonical.clear()
        _canonical[DEFAULT] = DEFAULT
    built = _build(op, kwargs)
    found = _by_keywords[key] = _canonical.setdefault(built, built)
    return found


def _build(op: str, kwargs: dict) -> ConvOptions:
    allowed = KEYWORDS[op]
    for name in kwargs:
        if name not in allowed:
            takes = ", ".join((*allowed, "out") if op in _TAKES_OUT else allowed)
            raise TypeError(f"{name}: {op} takes no keyword argument {name!r}; it takes {takes}")
    built = ConvOptions(**kwargs)
    return _canonical.get(built, built)

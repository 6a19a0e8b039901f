"""The keyword options of an op as one frozen, checked, hashable ConvOptions; the ABI numbers
they become come from _core (the header); the geometry rules of _geometry."""

import dataclasses
import itertools

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _core, _geometry
from flux_dnn._conv import _default_flags
from flux_dnn._discovery import REGISTRY
from flux_dnn._options import ACTIVATIONS, DEFAULT, ConvOptions, options


@pytest.fixture
def xw(rng):
    return rng.standard_normal((1, 2, 5, 5), dtype=np.float32), rng.standard_normal((3, 2, 3, 3), dtype=np.float32)


@pytest.mark.parametrize(
    "call,kw,error,match",
    [
        (
            "conv2d",
            dict(activaton="relu"),
            TypeError,
            r"activaton: conv takes no keyword argument 'activaton'; it takes ",
        ),
        ("conv2d", dict(alpha="2"), TypeError, r"alpha: expected a real number, got '2'"),
        ("conv2d", dict(deterministic="yes"), TypeError, r"deterministic: expected True or False, got 'yes'"),
        ("conv2d", dict(allow_reduced_precision=2), TypeError, r"allow_reduced_precision: expected True or False"),
        ("conv2d", dict(algorithm="fastest"), ValueError, r"algorithm: expected 'heuristic', 'benchmark' or an alg"),
        ("conv2d", dict(algorithm=True), TypeError, r"algorithm: expected an integer, got True"),
        ("conv2d", dict(workspace_limit=-1), ValueError, r"workspace_limit: expected None or a number of bytes >= 0"),
        ("conv2d", dict(activation=("clip", 0)), ValueError, r"activation: 'clip' takes 2 parameter\(s\)"),
        ("conv2d", dict(activation=("relu", "x")), ValueError, r"activation: 'relu' takes 0 parameter\(s\)"),
        ("conv2d", dict(activation=7), ValueError, r"activation: expected None, a name or \(name, \*parameters\)"),
        ("conv_plan", dict(beta=1.0), TypeError, r"beta: conv_plan takes no keyword argument 'beta'"),
        ("conv_plan", dict(out=None), TypeError, r"out: conv_plan takes no keyword argument 'out'"),
        ("conv_transpose2d", dict(activation="relu"), TypeError, r"activation: conv_transpose takes no keyword"),
    ],
)
def test_bad_options_name_the_argument(xw, call, kw, error, match):
    with pytest.raises(error, match=match):
        getattr(flux_dnn, call)(*xw, **kw)


def test_an_interned_int_does_not_accept_a_bool(xw):
    """algorithm=1 and algorithm=True compare equal, but only the int is an algorithm id."""
    flux_dnn.conv2d(*xw, algorithm=1)
    with pytest.raises(TypeError, match=r"algorithm: expected an integer, got True"):
        flux_dnn.conv2d(*xw, algorithm=True)


def test_options_are_frozen_hashable_and_shared():
    made = options("conv", {"activation": "leaky_relu", "alpha": 2})[0]
    assert made == ConvOptions(activation=("leaky_relu", 0.01), alpha=2.0)
    assert hash(made) == hash(ConvOptions(activation=("leaky_relu", 0.01), alpha=2.0))
    assert options("conv", {"activation": "leaky_relu", "alpha": 2})[0] is made
    assert options("conv", {"deterministic": False})[0] is DEFAULT  # equal options are one object
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.alpha = 3.0


def test_out_is_an_operand_not_an_option(xw):
    y = np.zeros((1, 3, 3, 3), np.float32)
    assert options("conv", {"out": y, "beta": 1.0}) == (ConvOptions(beta=1.0), y)
    with pytest.raises(ValueError, match=r"beta: beta=1.0 accumulates into an existing output, so it needs out="):
        options("conv", {"beta": 1})


def test_abi_numbers_come_from_the_header():
    header_names = {"gelu": "GELU_ERF"}  # the others are the upper-case Python name
    for name, (code, _) in ACTIVATIONS.items():
        assert code == _core.ABI_CONSTANTS[f"FDNN_ACTIVATION_{header_names.get(name, name.upper())}"]
    assert ConvOptions(activation=("clip", 0, 6)).activation_code() == (_core.ACTIVATION_CLIP, 0.0, 6.0)
    assert DEFAULT.activation_code() == (_core.ACTIVATION_NONE, 0.0, 0.0)
    assert ConvOptions(algorithm="benchmark").algorithm_policy() == (_core.ALGO_BENCHMARK, 0)
    assert ConvOptions(algorithm=3).algorithm_policy() == (_core.ALGO_GIVEN, 3)


def test_flags_start_from_the_device_default():
    det, reduced = _core.CONV_DETERMINISTIC, _core.CONV_ALLOW_REDUCED_PRECISION
    assert DEFAULT.flags(0) == 0 and DEFAULT.flags(reduced) == reduced  # None keeps the device's choice
    assert ConvOptions(allow_reduced_precision=False).flags(reduced) == 0
    assert ConvOptions(allow_reduced_precision=True).flags(0) == reduced
    assert ConvOptions(deterministic=True).flags(reduced) == det | reduced


def test_cpu_shims_default_to_full_precision():
    for entry in REGISTRY.usable_for(_core.DEVICE_CPU)[0]:
        assert _default_flags(entry.shim, 0) == 0, entry.name


# ------------------------------------------------------------------------------------------
# Geometry


def test_output_sizes_match_the_reference():
    for size, k, s, d, lo, hi in itertools.product((5, 8), (1, 3), (1, 2), (1, 2), (0, 2), (0, 1)):
        if size + lo + hi >= d * (k - 1) + 1:
            assert _geometry.output_size(size, k, s, d, lo, hi) == ref.out_size(size, k, s, d, lo, hi)


def test_equivalent_convolution_maps_the_transposed_output_back_onto_its_input():
    """For every transposed geometry, the equivalent convolution of the kept rows has exactly
    the transposed convolution's input size, with no negative padding."""
    for n, k, s, d, p, op in itertools.product((1, 4, 5), (1, 2, 3), (1, 2, 3), (1, 2, 3), (0, 1, 2), (0, 1, 2)):
        if op >= s and op >= d:
            continue
        geo = _geometry.Geometry((s,), (p,), (p,), (d,), 1)
        (out,) = _geometry.transposed_output_sizes((n,), (k,), geo, (op,))
        if out < 1:
            continue
        conv_geo, (trim,) = _geometry.equivalent_convolution((out,), (k,), (n,), geo)
        assert conv_geo.hi[0] >= 0 and 0 <= trim <= out
        if trim < out:  # (else every row of the output is output_padding's: zeros)
            assert _geometry.output_sizes((out - trim,), (k,), conv_geo) == (n,), (n, k, s, d, p, op)


@pytest.mark.parametrize(
    "shape,strides,expected",
    [
        ((2, 3, 4, 5), (60, 20, 5, 1), False),
        ((2, 3, 4, 5), (60, 1, 15, 3), True),
        ((2, 1, 4, 5), (20, 20, 5, 1), False),  # C = 1: both layouts; contiguous wins
        ((1, 3, 1, 1), (3, 1, 3, 3), False),  # 1x1 spatial: both again
        ((2, 3, 4, 5), (60, 2, 15, 3), False),  # neither
        ((2, 3, 4), None, False),
    ],
)
def test_channels_last_detection(shape, strides, expected):
    assert _geometry.is_channels_last(shape, strides) is expected
    if expected:
        assert _geometry.compact_strides(shape, _geometry.channels_last_order(len(shape))) == strides


def test_spec_carries_the_resolved_flags(xw):
    from flux_dnn import _conv

    x, w = (_conv._operand(a, name) for a, name in zip(xw, "xw"))
    specs = {
        choice: _conv._prepare_forward(2, x, w, None, 1, 0, 1, 1, ConvOptions(allow_reduced_precision=choice)).spec
        for choice in (None, True, False)
    }
    if not hasattr(specs[None], "flags"):
        pytest.skip("_core.ConvSpec.flags is bound from ABI 2.0 on")
    problem = _conv._Problem(_conv.FORWARD, 2, None, DEFAULT, (_core.DEVICE_CPU, 0), "float32", "x")
    shim = _conv._candidates(problem)[0].shim
    assert specs[None].flags == _default_flags(shim, 0) == 0  # a CPU: full precision unless asked
    assert specs[True].flags == _core.CONV_ALLOW_REDUCED_PRECISION and specs[False].flags == 0

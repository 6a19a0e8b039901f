"""flux_dnn.torch follows PyTorch's own flags at each call (issue 29): torch.use_deterministic_algorithms
and torch.backends.mkldnn on CPU tensors, torch.backends.cudnn on CUDA tensors; explicit options of
the functions and modules win."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flux_dnn  # noqa: E402
import flux_dnn.torch as ft  # noqa: E402
from reference import conv_forward  # noqa: E402


@pytest.fixture(autouse=True)
def restore_flags():
    """Every flag a test sets is put back."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.mkldnn.deterministic,
        torch.backends.mkldnn.conv.fp32_precision,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.allow_tf32,
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.mkldnn.deterministic = saved[1]
    torch.backends.mkldnn.conv.fp32_precision = saved[2]
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = saved[3:]


def policy_of(x, **options):
    return ft._policy(x, ft._explicit(**options))


def test_cpu_flags_and_explicit_options():
    x = torch.zeros(1, 1, 1, 1)
    assert policy_of(x) == 0
    torch.backends.cudnn.benchmark = torch.backends.cudnn.deterministic = True  # not for CPU tensors
    torch.backends.cudnn.allow_tf32 = False
    assert policy_of(x) == 0
    torch.use_deterministic_algorithms(True)
    assert policy_of(x) == ft.DETERMINISTIC
    assert policy_of(x, deterministic=False) == 0  # explicit wins
    torch.use_deterministic_algorithms(False)
    torch.backends.mkldnn.deterministic = True
    assert policy_of(x) == ft.DETERMINISTIC
    torch.backends.mkldnn.deterministic = False
    torch.backends.mkldnn.conv.fp32_precision = "bf16"
    assert policy_of(x) == ft.REDUCED_ON
    assert policy_of(x, allow_reduced_precision=False) == ft.REDUCED_OFF
    assert policy_of(x, algorithm="benchmark") == ft.REDUCED_ON | ft.BENCHMARK
    torch.backends.mkldnn.conv.fp32_precision = "ieee"
    assert policy_of(x) == 0


def test_xpu_tensors_follow_the_mkldnn_flags():
    """XPU tensors (PyTorch's oneDNN on Intel GPUs) take the mkldnn flags, not cudnn's; read
    through _flags by device type (no XPU here: the flags alone are checked)."""
    torch.backends.cudnn.benchmark = torch.backends.cudnn.deterministic = True  # not for XPU tensors
    assert ft._flags("xpu") == (False, False, None)
    torch.backends.mkldnn.deterministic = True
    torch.backends.mkldnn.conv.fp32_precision = "tf32"
    assert ft._flags("xpu") == (True, False, True)
    assert ft._flags("cpu")[2] is None  # tf32 means nothing to the CPU's oneDNN


def test_flags_change_the_plan_the_shim_makes(rng):
    """Each flag setting is a plan of its own (the flags are part of the plan), with correct
    values; where the CPU computes bfloat16, mkldnn's "bf16" precision shows in the error."""
    x = torch.from_numpy(rng.standard_normal((2, 16, 12, 12)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 16, 3, 3)).astype(np.float32))
    want = conv_forward(x.numpy(), w.numpy(), None, (1, 1), (1, 1), (1, 1))
    scale = float(np.abs(want).max())
    flux_dnn.clear_plan_cache()
    errors = {}
    for name, set_flag in [
        ("default", lambda: None),
        ("deterministic", lambda: torch.use_deterministic_algorithms(True)),
        ("bf16", lambda: setattr(torch.backends.mkldnn.conv, "fp32_precision", "bf16")),
    ]:
        set_flag()
        before = flux_dnn.plan_cache_info()["misses"]
        y = ft.conv2d(x, w, padding=1)
        assert flux_dnn.plan_cache_info()["misses"] == before + 1, name  # a plan for these flags
        errors[name] = float(np.abs(y.numpy() - want).max()) / scale
    assert errors["default"] < 1e-5 and errors["deterministic"] < 1e-5, errors
    assert errors["bf16"] < 2e-2, errors
    shim = flux_dnn._discovery.REGISTRY.shim_for(flux_dnn._core.DEVICE_CPU, "float32")
    if "bf16" in shim.device_info()["name"] or "amx" in shim.device_info()["name"]:
        assert errors["bf16"] > 1e-4, errors  # bfloat16 math, as asked
    explicit = ft.conv2d(x, w, padding=1, allow_reduced_precision=False)  # wins over the flag
    assert float(np.abs(explicit.numpy() - want).max()) / scale < 1e-5


def test_modules_and_convert_take_explicit_options(rng):
    conv = ft.Conv2d(4, 6, 3, padding=1, deterministic=True, algorithm="benchmark")
    assert conv.flux_options == ("benchmark", True, None)
    model = ft.convert(torch.nn.Sequential(torch.nn.Conv2d(4, 6, 3), torch.nn.ConvTranspose2d(6, 4, 3)),
                       allow_reduced_precision=False)  # fmt: skip
    assert [m.flux_options for m in model] == [(None, None, False)] * 2
    x = torch.from_numpy(rng.standard_normal((2, 4, 9, 9)).astype(np.float32))
    y = model(x)
    assert y.shape == (2, 4, 9, 9)
    y.sum().backward()
    assert ft.convert(torch.nn.Conv2d(4, 6, 3)).flux_options == ft._FOLLOW


def test_bad_options_name_the_argument():
    x, w = torch.zeros(1, 2, 5, 5), torch.zeros(3, 2, 3, 3)
    with pytest.raises(ValueError, match="algorithm: expected None .* got 'fastest'"):
        ft.conv2d(x, w, algorithm="fastest")
    with pytest.raises(TypeError, match="deterministic: expected None .* got 'yes'"):
        ft.Conv2d(2, 3, 3, deterministic="yes")


def test_cuda_flags(rng):
    """On CUDA tensors: cudnn.benchmark, .deterministic and .allow_tf32 (GPU machines only)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.zeros(1, 1, 1, 1, device="cuda")
    assert policy_of(x) == 0
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.allow_tf32 = False
    want = ft.BENCHMARK | ft.DETERMINISTIC | (0 if torch.version.hip else ft.REDUCED_OFF)
    assert policy_of(x) == want
    xs = torch.randn(2, 8, 10, 10, device="cuda")
    ws = torch.randn(4, 8, 3, 3, device="cuda")
    torch.testing.assert_close(ft.conv2d(xs, ws, padding=1), torch.nn.functional.conv2d(xs, ws, padding=1))

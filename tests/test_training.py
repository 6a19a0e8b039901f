"""Training with flux_dnn.torch: the digits example learns, matches the same model on
torch.nn.Conv2d, and DDP over 2 gloo processes ends with the single-process weights."""

import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import flux_dnn.torch as ft  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits():
    return _example("train_digits")


def test_digits_loss_falls(digits, rng):
    seed = int(rng.integers(1 << 16))
    x, y, _, _ = digits.load_digits_split(seed)
    model = digits.make_model(use_flux=True, seed=seed)
    assert sum(isinstance(m, ft.Conv2d) for m in model.modules()) == 2
    history = digits.train(model, x, y, epochs=3, seed=seed, log=None)
    assert history[-1] < 0.5 * history[0], history


def test_flux_and_torch_convs_train_alike(digits, rng):
    """20 SGD steps from identical weights and batches: flux_dnn's and torch's parameters agree.
    (SGD rather than the example's Adam: Adam's normalised steps turn float32 rounding in
    near-zero gradients into visible differences.)"""
    seed = int(rng.integers(1 << 16))
    x, y, _, _ = digits.load_digits_split(seed)
    models = [digits.make_model(use_flux=flux, seed=seed) for flux in (True, False)]
    for model in models:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for idx in digits.batches(len(x), 32, 0, seed)[:20]:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_digits_example_reaches_97_percent(digits):
    """The full example run (30 epochs, seed 0), as the README shows it."""
    result = digits.main([])
    assert result["accuracy"] >= 0.97, result["accuracy"]


def _run_ddp(tmp_path, world, steps=20):
    out = tmp_path / f"world{world}.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(
        [
            sys.executable,
            os.path.join(EXAMPLES, "ddp_train.py"),
            "--world-size",
            str(world),
            "--steps",
            str(steps),
            "--log-every",
            str(steps),
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        timeout=300,
    )
    return torch.load(out)


def test_ddp_two_processes_match_single_process(tmp_path):
    """Same global batches: DDP's averaged gradients reproduce the single-process updates."""
    single, ddp = _run_ddp(tmp_path, 1), _run_ddp(tmp_path, 2)
    assert list(single) == list(ddp)
    for name in single:
        assert not torch.equal(single[name], digits_initial_weights()[name]), f"{name} did not train"
        torch.testing.assert_close(
            ddp[name], single[name], rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )


def digits_initial_weights():
    return _example("train_digits").make_model(use_flux=True, seed=0).state_dict()

"""Progress of algorithm="benchmark" tuning on stderr (issue 29): a line per tuned layer when
asked (FLUX_DNN_PROGRESS=1) or on a terminal, a live line on a terminal, "still tuning" while
one runs on, nothing when turned off or when stderr is not a terminal. The thresholds are set
to zero here, so what is checked is what is said, never how long anything took."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import flux_dnn
from flux_dnn import _core, _progress


@pytest.fixture
def fresh_autotune(tmp_path):
    """An empty autotune store and plan cache: algorithm="benchmark" tunes in the test."""
    saved = _core.autotune_path()
    _core.set_autotune_path(str(tmp_path / "autotune.txt"))
    flux_dnn.clear_plan_cache()
    yield
    _core.set_autotune_path(saved)
    flux_dnn.clear_plan_cache()


@pytest.fixture
def every_tuning(monkeypatch):
    """Every tuning reported, however short; the process's tally from zero."""
    monkeypatch.setattr(_progress, "LONG_S", 0.0)
    monkeypatch.setattr(_progress, "_done", {"count": 0, "seconds": 0.0, "hinted": False})
    monkeypatch.setattr(_progress, "_forced", None)


def _conv_calls(rng):
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    kw = dict(padding=1, algorithm="benchmark")
    flux_dnn.conv2d(x, w, **kw)
    flux_dnn.conv_backward_data(dy, w, x.shape, **kw)
    flux_dnn.conv_backward_weight(x, dy, w.shape, **kw)
    flux_dnn.conv_transpose2d(dy, w, padding=1, algorithm="benchmark")
    flux_dnn.conv_plan(x, w, padding=1, algorithm="benchmark")
    flux_dnn.conv2d(x, w, **kw)  # a pattern seen already: no tuning, no line


def test_a_line_per_tuned_layer_when_asked(monkeypatch, capsys, fresh_autotune, every_tuning, rng):
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "1")
    _conv_calls(rng)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("flux_dnn: tuned forward float32 x (2, 8, 12, 12) w (8, 8, 3, 3) on CPU:0 (")
    assert "FLUX_DNN_PROGRESS=0 turns these lines off" in lines[0]
    assert "turns these lines off" not in lines[1]  # said once
    assert lines[1].startswith("flux_dnn: tuned backward-data float32 dy (2, 8, 12, 12) w (8, 8, 3, 3)")
    assert lines[2].startswith("flux_dnn: tuned backward-weight float32 x (2, 8, 12, 12) dy (2, 8, 12, 12)")
    assert "tuning 5 of this process" in lines[4]


@pytest.mark.parametrize("value", ["0", "off"])
def test_nothing_when_turned_off(monkeypatch, capsys, fresh_autotune, every_tuning, rng, value):
    monkeypatch.setenv("FLUX_DNN_PROGRESS", value)
    monkeypatch.setattr(_progress, "_tty", lambda: True)  # even on a terminal
    _conv_calls(rng)
    assert capsys.readouterr().err == ""


def test_quiet_by_default_when_stderr_is_not_a_terminal(monkeypatch, capsys, fresh_autotune, every_tuning, rng):
    monkeypatch.delenv("FLUX_DNN_PROGRESS", raising=False)
    _conv_calls(rng)
    assert capsys.readouterr().err == ""


def test_heuristic_calls_say_nothing(monkeypatch, capsys, every_tuning, rng):
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "1")
    flux_dnn.conv2d(rng.standard_normal((1, 3, 9, 9)).astype(np.float32), np.ones((2, 3, 3, 3), np.float32))
    assert capsys.readouterr().err == ""


def test_a_long_tuning_says_it_is_still_running(monkeypatch, capsys, every_tuning):
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "lines")
    monkeypatch.setattr(_progress, "STILL_S", 0.01)
    released = threading.Event()
    with _progress.tuning(lambda: "layer A"):
        released.wait(0.2)  # stands for a vendor's search that runs on
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("flux_dnn: still tuning layer A, ") and lines[-1].startswith("flux_dnn: tuned layer A")


def test_a_live_line_on_a_terminal(monkeypatch, capsys, every_tuning):
    monkeypatch.delenv("FLUX_DNN_PROGRESS", raising=False)
    monkeypatch.setattr(_progress, "_tty", lambda: True)
    monkeypatch.setattr(_progress, "LIVE_FIRST_S", 0.01)
    monkeypatch.setattr(_progress, "LIVE_EVERY_S", 0.01)
    with _progress.tuning(lambda: "layer B"):
        threading.Event().wait(0.2)
    err = capsys.readouterr().err
    assert err.startswith("\r\x1b[Kflux_dnn: tuning layer B ... ")  # redrawn in place
    assert err.endswith("\n") and "\r\x1b[Kflux_dnn: tuned layer B in " in err  # erased by the last line


def test_nested_tunings_report_once(monkeypatch, capsys, every_tuning):
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "1")
    with _progress.tuning(lambda: "outer"):
        assert not _progress.wanted()
        with _progress.tuning(lambda: "inner"):
            pass
    assert capsys.readouterr().err.count("flux_dnn: tuned") == 1


def test_configure_and_a_bad_value(monkeypatch):
    monkeypatch.setattr(_progress, "_forced", None)
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "loud")
    monkeypatch.setattr(_progress, "_warned", set())
    with pytest.warns(RuntimeWarning, match="FLUX_DNN_PROGRESS='loud' is not one of"):
        assert _progress.mode() == "auto"
    _progress.configure("off")
    assert _progress.mode() == "off"
    _progress.configure(None)
    with pytest.raises(ValueError, match="mode: expected 'auto', 'lines', 'off' or None, got 'on'"):
        _progress.configure("on")


def test_a_long_benchmark_row_says_it_is_still_measured(monkeypatch, capsys, every_tuning):
    """python -m flux_dnn bench's rows: "still measuring" while one runs on (a slow peer),
    nothing more (the row's own line follows)."""
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "1")
    monkeypatch.setattr(_progress, "STILL_S", 0.01)
    with _progress.working("measuring row C"):
        threading.Event().wait(0.2)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("flux_dnn: still measuring row C, ") for line in lines)
    monkeypatch.setenv("FLUX_DNN_PROGRESS", "0")
    with _progress.working("measuring row D"):
        threading.Event().wait(0.05)
    assert capsys.readouterr().err == ""

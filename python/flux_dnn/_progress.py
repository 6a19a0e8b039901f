"""Progress of long work, on stderr: ``algorithm="benchmark"`` tuning (the vendor candidates
timed when a new call pattern first runs, in the core and the shims, without the GIL) and
the rows of ``python -m flux_dnn bench``.

FLUX_DNN_PROGRESS chooses:
  unset, "auto"           only when stderr is a terminal: a live line while a tuning runs,
                          and a line per tuned layer once tuning takes long
  "1", "on", "lines"      those lines also when stderr is not a terminal (logs, CI)
  "0", "off"              nothing
A tuning gets its line when it took LONG_S or more, or once the process has spent BUSY_S
tuning (then every layer that really tuned gets one, so a model of many quick layers is not
silent either); while one runs on, a line says so every STILL_S (a live line on a terminal),
so no minute passes in silence. A benchmark row (``working``) that runs on gets the same
"still" lines; python -m flux_dnn bench prints its rows itself and turns "lines" on for its
run (off with --no-progress).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings

LONG_S = 1.0  # a tuning this long gets its line
BUSY_S = 5.0  # after this much tuning in the process, every real tuning gets its line
REAL_S = 0.05  # shorter than this, the choice came from the autotune store: not a tuning
STILL_S = 20.0  # lines: "still tuning" while one tuning runs on
LIVE_FIRST_S, LIVE_EVERY_S = 1.0, 0.5  # terminal: when the live line appears, how often it is redrawn

_MODES = {"": "auto", "auto": "auto", "0": "off", "off": "off", "no": "off", "false": "off"}
_MODES |= dict.fromkeys(("1", "on", "yes", "true", "lines"), "lines")

_forced: str | None = None
_local = threading.local()
_lock = threading.Lock()
_done = {"count": 0, "seconds": 0.0, "hinted": False}
_warned: set = set()


def configure(mode: str | None) -> None:
    """Overrides FLUX_DNN_PROGRESS for this process ("auto", "lines", "off"); None: follow
    it again. python -m flux_dnn bench sets "lines" (its --no-progress "off")."""
    global _forced
    if mode is not None and mode not in ("auto", "lines", "off"):
        raise ValueError(f"mode: expected 'auto', 'lines', 'off' or None, got {mode!r}")
    _forced = mode


def mode() -> str:
    """The mode, "auto", "lines" or "off": configure()'s, else FLUX_DNN_PROGRESS's (read at each use:
    it can be set at run time)."""
    if _forced is not None:
        return _forced
    value = os.environ.get("FLUX_DNN_PROGRESS", "").strip().lower()
    if value not in _MODES:
        if value not in _warned:
            _warned.add(value)
            warnings.warn(
                f"FLUX_DNN_PROGRESS={value!r} is not one of {', '.join(repr(k) for k in _MODES if k)}: "
                "taken as 'auto' (progress only on a terminal)",
                RuntimeWarning,
                stacklevel=3,
            )
        return "auto"
    return _MODES[value]


def _tty() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no stderr, or closed: progress is optional
        pass


@contextlib.contextmanager
def tuning(describe):
    """Around the first run of a new pattern under algorithm="benchmark": reports it as
    the module's docstring says. describe() -> str names the layer (called only to print).
    Nested uses (a call pattern that runs another) report once."""
    current = mode()
    tty = _tty()
    if current == "off" or (current == "auto" and not tty) or getattr(_local, "watching", False):
        yield
        return
    _local.watching = True
    start = time.monotonic()
    try:
        with _watcher(lambda: f"tuning {describe()}", tty, _tally) as spoke:
            yield
    finally:
        _local.watching = False
        _finish(describe, time.monotonic() - start, bool(spoke), tty)


@contextlib.contextmanager
def working(what: str):
    """Around one step of long work the user started and waits for (a row of python -m
    flux_dnn bench, which reports the row itself when it ends): a line every STILL_S while
    it runs on, so that a slow peer's row is not a silent minute either."""
    current = mode()
    if current == "off" or (current == "auto" and not _tty()):
        yield
        return
    with _watcher(lambda: what, False, lambda: ""):
        yield


@contextlib.contextmanager
def _watcher(what, live: bool, tally):
    """A thread that says what() is still running: a live line on a terminal (erased when
    it ends), else a line every STILL_S. Yields the list of the times it spoke."""
    done, spoke = threading.Event(), []
    start = time.monotonic()
    watcher = threading.Thread(target=_watch, args=(done, spoke, what, start, live, tally), daemon=True)
    watcher.start()
    try:
        yield spoke
    finally:
        done.set()
        watcher.join()


def _watch(done: threading.Event, spoke: list, what, start: float, live: bool, tally) -> None:
    wait = LIVE_FIRST_S if live else STILL_S
    while not done.wait(wait):
        elapsed = time.monotonic() - start
        if live:
            _write(f"\r\x1b[Kflux_dnn: {what()} ... {elapsed:.1f} s{tally()}")
            wait = LIVE_EVERY_S
        else:
            _write(f"flux_dnn: still {what()}, {elapsed:.1f} s so far{tally()}\n")
        spoke.append(elapsed)


def _tally() -> str:
    n, seconds = _done["count"], _done["seconds"]
    return f" ({n} tuned before it, {seconds:.1f} s)" if n else ""


def _finish(describe, elapsed: float, spoke: bool, tty: bool) -> None:
    with _lock:
        busy = _done["seconds"] >= BUSY_S
        _done["count"] += 1
        _done["seconds"] += elapsed
        if not (spoke or elapsed >= LONG_S or (busy and elapsed >= REAL_S)):
            return
        hint = "" if _done["hinted"] else "; FLUX_DNN_PROGRESS=0 turns these lines off"
        _done["hinted"] = True
        tally = f"tuning {_done['count']} of this process, {_done['seconds']:.1f} s in all"
    erase = "\r\x1b[K" if tty else ""
    _write(f"{erase}flux_dnn: tuned {describe()} in {elapsed:.2f} s (algorithm='benchmark'; {tally}{hint})\n")


def tunes(options) -> bool:
    """Whether a new call pattern with these ConvOptions times its candidates."""
    return options.algorithm == "benchmark"


def wanted() -> bool:
    """Whether a tuning starting now would be reported (cheap: a new pattern asks it)."""
    if getattr(_local, "watching", False):
        return False
    current = mode()
    return current == "lines" or (current == "auto" and _tty())

"""pytest plugin of scripts/gpu_check.sh: each test's outcome written the moment it is known.

A GPU check run can be cut short by its time limit (SIGINT, then SIGKILL), and pytest's junit
file is written only at the end. This plugin appends one line per test phase that decides an
outcome to the file named by FLUX_DNN_CHECK_RESULTS, flushed at once, so a run killed halfway
still says what passed, what failed (with the first line of its error) and what never ran:
the collected tests with no outcome line. `gpu_check.sh --rerun-failed` reads the same file.

Lines (tab-separated, one record each):
    collected  GROUP  NODEID
    outcome    GROUP  NODEID  passed|failed|error|skipped  SECONDS  FIRST_LINE  PROPERTIES_JSON

FLUX_DNN_CHECK_ONLY names a file of node ids (one per line): only those run (the rerun).
FLUX_DNN_CHECK_GROUP names the group written in each line ("tests", "conformance", ...).
"""

from __future__ import annotations

import json
import os

import pytest


def _clean(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


class _Results:
    def __init__(self, path: str, group: str):
        self.group = group
        self.file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 -- open for the run

    def write(self, *fields) -> None:
        self.file.write("\t".join([fields[0], self.group, *map(str, fields[1:])]) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def _first_line(report) -> str:
    """The line a reader needs first: the exception of a failure, the reason of a skip."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return _clean(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return _clean(crash.message)
    lines = [line for line in str(longrepr).splitlines() if line.startswith("E ")]
    return _clean(lines[0][1:] if lines else str(longrepr).splitlines()[-1])


def _outcome(report) -> str | None:
    """The outcome this phase decides, or None (a passing setup or teardown decides nothing)."""
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "failed" if report.passed else "skipped"  # xpass is a failure (xfail_strict)
        return report.outcome
    if report.failed:
        return "error"
    if report.skipped and report.when == "setup":
        return "skipped"
    return None


_results: _Results | None = None


def pytest_configure(config):
    global _results
    path = os.environ.get("FLUX_DNN_CHECK_RESULTS")
    if path:
        _results = _Results(path, os.environ.get("FLUX_DNN_CHECK_GROUP", "tests"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    only_path = os.environ.get("FLUX_DNN_CHECK_ONLY")
    if only_path:
        with open(only_path, encoding="utf-8") as f:
            wanted = {line.rstrip("\n") for line in f if line.strip()}
        kept = [item for item in items if item.nodeid in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = kept
    if _results is not None:
        for item in items:
            _results.write("collected", item.nodeid)


def pytest_runtest_logreport(report):
    outcome = _outcome(report)
    if _results is None or outcome is None:
        return
    properties = json.dumps(dict(report.user_properties), default=str) if report.user_properties else "{}"
    _results.write("outcome", report.nodeid, outcome, f"{report.duration:.2f}", _first_line(report), properties)

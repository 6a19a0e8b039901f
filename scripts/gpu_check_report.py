"""The reading side of scripts/gpu_check.sh: its gate, its table, its rerun selection and the
rehearsal's verdict. Standard library only (it runs before anything is known to import).

    python gpu_check_report.py gate                     # exit 0 when cuDNN is usable on >= 1 GPU
    python gpu_check_report.py table LOGS [--rehearsal] # the table, at most 60 lines
    python gpu_check_report.py rerun GROUP PRIOR OUT    # node ids of GROUP to run again
    python gpu_check_report.py verify-rehearsal OUT     # the rehearsal's checks of its own run
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

MAX_LINES = 60  # the table fits one screen: the run's whole verdict at a glance
MAX_RESULT_FILES = 8  # what the GPU check machine returns from $OUT
GROUPS = ("tests", "conformance", "jax")
SEVERITY = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


# ---- gate ----------------------------------------------------------------------------------
def gate() -> int:
    """The first GPU call of the run: cuDNN loaded and sees a device, or why not. Without it
    every GPU test skips and pytest exits 0, so a run must never go on past this."""
    import flux_dnn

    shims = [s for s in flux_dnn.shims() if s.name == "cudnn"]
    if not shims:
        print("cuDNN shim not registered: flux-dnn-cuda13 is not installed")
        return 1
    s = shims[0]
    if not s.usable or s.num_devices < 1:
        print(f"cuDNN shim not usable: {s.reason or 'no device'}")
        return 1
    print(f"cuDNN shim usable: {s.num_devices} device(s), {s.device_name}, cuDNN {s.vendor_version_runtime}")
    return 0


# ---- results files -------------------------------------------------------------------------
def read_results(path: pathlib.Path) -> dict:
    """group -> nodeid -> dict(outcome, seconds, first, properties); collected tests with no
    outcome line have outcome "not run" (the step was cut short before them)."""
    groups: dict = {}
    if not path.exists():
        return groups
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        kind, group, nodeid = fields[:3]
        tests = groups.setdefault(group, {})
        if kind == "collected":
            tests.setdefault(nodeid, {"outcome": "not run", "seconds": 0.0, "first": "", "properties": {}})
        elif kind == "outcome" and len(fields) >= 7:
            outcome, seconds, first, properties = fields[3], float(fields[4]), fields[5], fields[6]
            entry = tests.setdefault(nodeid, {"outcome": "not run", "seconds": 0.0, "first": "", "properties": {}})
            entry["seconds"] += seconds
            entry["properties"].update(json.loads(properties or "{}"))
            if entry["outcome"] == "not run" or SEVERITY[outcome] > SEVERITY[entry["outcome"]]:
                entry["outcome"], entry["first"] = outcome, first or entry["first"]
    return groups


def rerun(group: str, prior: str, out: str) -> int:
    """Writes the node ids of GROUP that failed, errored or never ran in an earlier run."""
    tests = read_results(pathlib.Path(prior) / "results.tsv").get(group, {})
    again = [nodeid for nodeid, t in tests.items() if t["outcome"] in ("failed", "error", "not run")]
    pathlib.Path(out).write_text("".join(f"{nodeid}\n" for nodeid in again), encoding="utf-8")
    print(len(again))
    return 0


# ---- the table -----------------------------------------------------------------------------
def read_steps(logs: pathlib.Path) -> list:
    path = logs / "steps.tsv"
    if not path.exists():
        return []
    return [line.split("\t") for line in path.read_text().splitlines() if line.count("\t") >= 3]


def verdict(steps: list, groups: dict, rehearsal: bool) -> list:
    """The reasons the run failed, most basic first; empty when it passed."""
    reasons = []
    for name, result, _seconds, _limit, *detail in steps:
        if result not in ("ok", "rehearsed"):
            reasons.append(f"{name}: {result}{(': ' + detail[0]) if detail and detail[0] else ''}")
    for group, tests in groups.items():
        counts = count(tests)
        if rehearsal:
            continue
        if counts["passed"] == 0:
            reasons.append(f"{group}: no test passed ({counts['skipped']} skipped): nothing was checked on the GPU")
        if counts["failed"] + counts["error"]:
            reasons.append(f"{group}: {counts['failed'] + counts['error']} failed")
        if counts["not run"]:
            reasons.append(f"{group}: {counts['not run']} never ran (cut short)")
    return reasons


def count(tests: dict) -> dict:
    counts = dict.fromkeys(("passed", "failed", "error", "skipped", "not run"), 0)
    for t in tests.values():
        counts[t["outcome"]] += 1
    return counts


def test_file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def group_lines(groups: dict) -> list:
    lines = [f"{'tests':44} {'pass':>5} {'fail':>5} {'skip':>5} {'notrun':>6} {'s':>6}"]
    for group in GROUPS:
        tests = groups.get(group)
        if not tests:
            continue
        c = count(tests)
        seconds = sum(t["seconds"] for t in tests.values())
        lines.append(
            f"{group:44} {c['passed']:5} {c['failed'] + c['error']:5} {c['skipped']:5} {c['not run']:6} {seconds:6.0f}"
        )
        for file in sorted({test_file(n) for n in tests}):
            sub = {n: t for n, t in tests.items() if test_file(n) == file}
            c = count(sub)
            lines.append(
                f"  {file[-42:]:42} {c['passed']:5} {c['failed'] + c['error']:5} {c['skipped']:5} {c['not run']:6} "
                f"{sum(t['seconds'] for t in sub.values()):6.0f}"
            )
    return lines


def failure_lines(groups: dict, room: int) -> list:
    failing = [
        (nodeid, t) for tests in groups.values() for nodeid, t in tests.items() if t["outcome"] in ("failed", "error")
    ]
    if not failing or room < 2:
        return [f"failing tests: {len(failing)} (results.tsv)"] if failing else []
    lines = [f"failing tests ({len(failing)}; first error line):"]
    shown = failing[: room - 2] if len(failing) > room - 1 else failing
    for nodeid, t in shown:
        lines.append(f"  {nodeid.split('/')[-1][:70]}")
        lines[-1] += f"  | {t['first'][:110]}" if len(lines[-1]) < 60 else f"\n    {t['first'][:110]}"
    if len(shown) < len(failing):
        lines.append(f"  ... and {len(failing) - len(shown)} more in results.tsv")
    return [part for line in lines for part in line.split("\n")][:room]


def fused_line(groups: dict) -> list:
    for tests in groups.values():
        for nodeid, t in tests.items():
            if "runs_fused" in nodeid and "algorithm" in t["properties"]:
                return [f"NHWC fp16 bias+ReLU test ({t['outcome']}): {t['properties']['algorithm'][:90]}"]
    return []


def geomean(values: list) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def bench_lines(logs: pathlib.Path) -> list:
    path = logs / "bench.json"
    if not path.exists():
        return ["benchmark: no results"]
    data = json.loads(path.read_text())
    rows = data.get("rows", [])
    ok = [r for r in rows if "ratio" in r]
    lines = [f"benchmark ({len(ok)} measured, {len(rows) - len(ok)} failed): torch/flux_dnn time, > 1: flux faster"]
    epilogue = [r for r in ok if "fused" in r]
    if epilogue:
        fused = sum(r["fused"] for r in epilogue)
        lines.append(f"  bias+ReLU forward: {fused} fused, {len(epilogue) - fused} conv + epilogue kernel")
    keys: dict = {}
    for r in ok:
        for key in (r["dtype"] + (" NHWC" if r["channels_last"] else " NCHW"), r["op"], "all"):
            keys.setdefault(key, []).append(r["ratio"])
    for key, v in keys.items():
        lines.append(f"  {key:16} n={len(v):3} geomean {geomean(v):6.3f} min {min(v):6.2f}")
    host, plan = data.get("host_us", {}), data.get("plan_s", {})
    if host:
        torch_us, flux_us = host.get("torch", 0), host.get("flux_dnn", 0)
        lines.append(f"  host us per tiny conv: torch {torch_us:.1f}, flux_dnn {flux_us:.1f}")
    if "first" in plan:
        lines.append(
            f"  plan s (NHWC fp16 conv+bias+ReLU): first {plan['first']:.2f}, other thread "
            f"{plan['other_thread']:.2f}, again {plan['again']:.2f}"
        )
    elif plan:
        lines.append(f"  plan timing failed: {plan.get('error', '')[:100]}")
    return lines


def table(logs_dir: str, rehearsal: bool = False) -> int:
    logs = pathlib.Path(logs_dir)
    steps = read_steps(logs)
    groups = read_results(logs / "results.tsv")
    reasons = verdict(steps, groups, rehearsal)
    head = ["==================== gpu_check summary ===================="]
    if rehearsal:
        head.append("REHEARSAL (no GPU): steps up to the first GPU call, test selection collected only")
    passed = (
        "REHEARSED: every step up to the first GPU call ran; each group's tests collected, none run"
        if rehearsal
        else "PASSED: every step ran, no test failed, each group passed tests"
    )
    head += [f"FAILED: {r}" for r in reasons[:6]] or [passed]
    if len(reasons) > 6:
        head.append(f"FAILED: ... and {len(reasons) - 6} more reasons")
    step_lines = [f"{'step':34} {'result':14} {'s':>5} {'limit':>5}"]
    step_lines += [f"{s[0][:34]:34} {s[1][:14]:14} {s[2]:>5} {s[3]:>5}" for s in steps]
    tail = fused_line(groups) + bench_lines(logs)
    body = step_lines + group_lines(groups)
    room = MAX_LINES - len(head) - len(body) - len(tail)
    lines = head + body + failure_lines(groups, room) + tail
    print("\n".join(lines[:MAX_LINES]))
    return 1 if reasons else 0


# ---- the rehearsal's own checks ------------------------------------------------------------
def verify_rehearsal(out_dir: str) -> int:
    """What the rehearsal proves: every step before the first GPU call succeeded, the test
    selection of every group collects, the rerun selection picks exactly the tests that did
    not run, and the run leaves at most 8 files in $OUT with a table of at most 60 lines."""
    out = pathlib.Path(out_dir)
    problems = []
    files = [p for p in out.rglob("*") if p.is_file()]
    if len(files) > MAX_RESULT_FILES:
        problems.append(f"{len(files)} files in $OUT, more than {MAX_RESULT_FILES}: {sorted(p.name for p in files)}")
    table_file = out / "table.txt"
    if not table_file.exists():
        problems.append("no table.txt")
    elif len(table_file.read_text().splitlines()) > MAX_LINES:
        problems.append(f"table.txt has {len(table_file.read_text().splitlines())} lines, more than {MAX_LINES}")
    steps = read_steps(out)
    names = [s[0] for s in steps]
    for name, result, *_ in steps:
        if result not in ("ok", "rehearsed"):
            problems.append(f"step {name!r}: {result}")
    if not any(n.startswith("gate") for n in names):
        problems.append("the gate (first GPU call) did not run")
    groups = read_results(out / "results.tsv")
    for group in ("tests", "conformance"):
        if not groups.get(group):
            problems.append(f"group {group!r} collected no test")
    print("\n".join(f"rehearsal: {p}" for p in problems) or f"rehearsal: ok ({len(files)} result files, {names})")
    return 1 if problems else 0


def main(argv: list) -> int:
    command, args = argv[0], argv[1:]
    if command == "gate":
        return gate()
    if command == "table":
        return table(args[0], "--rehearsal" in args)
    if command == "rerun":
        return rerun(*args)
    if command == "verify-rehearsal":
        return verify_rehearsal(args[0])
    raise SystemExit(f"unknown command {command!r}: {__doc__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# One-shot check of the cuDNN shim on a lent NVIDIA GPU machine (no network). Its image has
# CUDA 13 (nvcc), cmake, pybind11, scikit-build-core, numpy, pytest, cupy-cuda13x,
# nvidia-cudnn-cu13 and torch (cu130); it lacks the oneDNN wheels, so the core is built
# without the oneDNN shim. Builds and installs flux_dnn and flux-dnn-cuda13 from this
# checkout (the GPU's own architecture only), runs the ABI/cuDNN tests and the GPU
# conformance tests on CuPy arrays and torch CUDA tensors, runs the GPU benchmark, and prints
# a table last. Every step has a timeout; their sum (575 s) fits one 10-minute command.
# Aim: under 6 minutes on an H200 (not yet measured there; 189 s here on 2 CPU cores with a
# stand-in nvidia-smi, every GPU test skipping), leaving room for a rerun in a 15-minute
# lease. Random draws use fixed per-test seeds (FLUX_DNN_GPU_RUN=1), so a rerun
# draws the same cases.
#
#   bash scripts/gpu_check.sh              # logs and junit files go to $OUT (or ./gpu_check_logs)
#   bash scripts/gpu_check.sh --dry-run    # the plan and whether there is a GPU; builds nothing
#   bash scripts/gpu_check.sh --table DIR  # the table of an earlier run's logs
#
# Overrides: FLUX_DNN_CUDA_ARCHS (default 90-real: an H200), PYTHON, T_<STEP> seconds for a
# step's timeout (T_BUILD_CORE, T_BUILD_CUDA, T_INFO, T_TESTS, T_CONFORMANCE, T_BENCH),
# BENCH_BUDGET_S, FLUX_DNN_TEST_SEED_BASE (another set of draws).
# Exit status: 0 all passed; 1 something failed or was cut short; 3 no GPU here.
set -uo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ARCHS="${FLUX_DNN_CUDA_ARCHS:-90-real}"
T_BUILD_CORE="${T_BUILD_CORE:-90}"
T_BUILD_CUDA="${T_BUILD_CUDA:-90}"
T_INFO="${T_INFO:-15}"
T_TESTS="${T_TESTS:-90}"
T_CONFORMANCE="${T_CONFORMANCE:-200}"
T_BENCH="${T_BENCH:-70}"
BENCH_BUDGET_S="${BENCH_BUDGET_S:-40}"

# ---- the table (also: --table DIR) --------------------------------------------------------
print_table() {
  "$PY" - "$1" <<'PY'
import json, pathlib, re, sys
import xml.etree.ElementTree as ET

logs = pathlib.Path(sys.argv[1])
print("\n==================== gpu_check summary ====================")
steps = [line.split("\t") for line in (logs / "steps.tsv").read_text().splitlines() if line] if (logs / "steps.tsv").exists() else []
print(f"{'step':28} {'result':12} {'seconds':>8} {'limit':>6}")
for name, result, seconds, limit in steps:
    print(f"{name:28} {result:12} {seconds:>8} {limit:>6}")
total = sum(float(s[2]) for s in steps) if steps else 0.0
print(f"{'total':28} {'':12} {total:8.0f}")

def counts_from_junit(path):
    root = ET.parse(path).getroot()
    per_file = {}
    for case in root.iter("testcase"):
        parts = [p for p in (case.get("classname") or "").split(".") if p and not p.startswith("Test")]
        file = "/".join(parts) + ".py" if parts else "(cut short)"
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                kind = "failed"
            elif child.tag == "skipped":
                kind = "skipped"
        c = per_file.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0})
        c[kind] += 1
    return per_file

def counts_from_log(path):
    # -v lines: "tests/x.py::test[id] PASSED" (a run cut short before pytest wrote its junit)
    per_file = {}
    for m in re.finditer(r"^(\S+?\.py)::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", path.read_text(errors="replace"), re.M):
        kind = {"PASSED": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}.get(m.group(2), "failed")
        c = per_file.setdefault(m.group(1), {"passed": 0, "failed": 0, "skipped": 0})
        c[kind] += 1
    return per_file

print(f"\n{'tests':40} {'passed':>7} {'failed':>7} {'skipped':>8}")
for group in ("tests", "conformance"):
    junit, log = logs / f"junit_{group}.xml", logs / f"pytest_{group}.txt"
    source = ""
    try:
        per_file = counts_from_junit(junit)
    except (OSError, ET.ParseError):
        per_file = counts_from_log(log) if log.exists() else {}
        source = " (from the log: no junit)"
    if not per_file:
        print(f"{group:40} {'not run' if not log.exists() else 'no results'}")
        continue
    sums = {k: sum(c[k] for c in per_file.values()) for k in ("passed", "failed", "skipped")}
    print(f"{group + source:40} {sums['passed']:7} {sums['failed']:7} {sums['skipped']:8}")
    for file, c in sorted(per_file.items()):
        print(f"  {file[-38:]:38} {c['passed']:7} {c['failed']:7} {c['skipped']:8}")

fused_log = logs / "pytest_conformance.txt"
if fused_log.exists():
    m = re.findall(r"algorithm: (.*)", fused_log.read_text(errors="replace"))
    if m:
        print(f"\nNHWC float16 bias+ReLU test ran: {m[0][:100]}")

bench = logs / "bench.json"
if bench.exists():
    data = json.loads(bench.read_text())
    rows = [r for r in data.get("rows", []) if "ratio" in r]
    failed = len(data.get("rows", [])) - len(rows)
    epilogue = [r for r in rows if "fused" in r]
    fused = sum(r["fused"] for r in epilogue)
    print(f"\nbias+ReLU forward in the benchmark: {fused} fused, {len(epilogue) - fused} conv + epilogue kernel")
    print("benchmark ratio torch/flux_dnn (> 1: flux_dnn faster), geomean and min:")
    import math
    def geo(v):
        return math.exp(sum(map(math.log, v)) / len(v))
    groups = {}
    for r in rows:
        for key in (r["op"], r["dtype"], "NHWC" if r["channels_last"] else "NCHW", "all"):
            groups.setdefault(key, []).append(r["ratio"])
    for key, v in groups.items():
        print(f"  {key:14} n={len(v):3} geomean {geo(v):6.3f} min {min(v):6.2f}")
    host = data.get("host_us", {})
    if host:
        print(f"  host us per tiny conv: torch {host.get('torch', 0):.1f}, flux_dnn {host.get('flux_dnn', 0):.1f}")
    if failed:
        print(f"  failed measurements: {failed}")
    plan = data.get("plan_s", {})
    if "first" in plan:
        print(
            f"  plan s, NHWC fp16 conv+bias+ReLU: first {plan['first']:.3f}, another thread's first call "
            f"{plan['other_thread']:.3f}, same problem again {plan['again']:.3f} ({plan['algorithm'][:60]})"
        )
    elif plan:
        print(f"  plan timing failed: {plan.get('error', '')[:100]}")
else:
    print("\nbenchmark: no results")
PY
}

if [ "${1:-}" = "--table" ]; then
  print_table "${2:?--table needs the logs directory}"
  exit 0
fi

LOGS="${OUT:-gpu_check_logs}"
mkdir -p "$LOGS"
: > "$LOGS/steps.tsv"
status=0

# run_step NAME LIMIT_S COMMAND...: runs with a timeout (SIGINT first, so pytest still writes
# its junit and summary; killed 10 s later), logs its time and result.
run_step() {
  local name=$1 limit=$2 start rc result
  shift 2
  echo
  echo "=== $name (limit ${limit}s, $(date -u +%H:%M:%S))"
  start=$(date +%s)
  timeout --signal=INT --kill-after=10 "$limit" "$@"
  rc=$?
  case $rc in
    0) result=ok ;;
    124 | 130 | 137) result="CUT ${limit}s"; status=1 ;;
    *) result="FAILED rc=$rc"; status=1 ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$(($(date +%s) - start))" "$limit" >> "$LOGS/steps.tsv"
  echo "--- $name: $result"
  return $rc
}

no_gpu_reason() {
  if ! command -v nvidia-smi > /dev/null; then
    echo "nvidia-smi not found (no NVIDIA driver)"
  elif ! nvidia-smi -L 2>&1 | grep -q "^GPU "; then
    echo "nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
}

echo "gpu_check: archs $ARCHS; limits (s): core build $T_BUILD_CORE, cuDNN wheel build $T_BUILD_CUDA," \
  "info $T_INFO, tests $T_TESTS, conformance $T_CONFORMANCE, benchmark $T_BENCH (budget ${BENCH_BUDGET_S}s)"
why=$(no_gpu_reason)
if [ -n "$why" ]; then
  echo
  echo "gpu_check: NO GPU HERE: $why. Nothing was built or checked; this script needs an NVIDIA GPU."
  printf 'machine\tNO GPU\t0\t0\n' >> "$LOGS/steps.tsv"
  print_table "$LOGS"
  exit 3
fi
if [ "${1:-}" = "--dry-run" ]; then
  nvidia-smi -L
  echo "gpu_check: dry run: a GPU is here; nothing built"
  exit 0
fi

export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export FLUX_DNN_GPU_RUN=1 # fixed per-test seeds (tests/conftest.py)

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  nvcc --version | tail -1
  "$PY" - << 'PY'
import importlib
for m in ("numpy", "pytest", "torch", "cupy", "jax", "scikit_build_core", "pybind11", "nvidia.cudnn"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:18} {getattr(mod, '__version__', '') or list(getattr(mod, '__path__', ['?']))[0]}")
    except Exception as exc:
        print(f"{m:18} MISSING: {exc}")
PY
}
run_step "machine" 20 bash -c "$(declare -f machine); PY='$PY' machine"

# (Warnings as errors are CI's job; here a new compiler warning must not cost the GPU run.)
# Build folders persist, so a rerun on the same machine rebuilds only what changed.
run_step "build core" "$T_BUILD_CORE" "$PY" -m pip install --no-build-isolation --no-deps -v . \
  -C cmake.define.FLUX_DNN_BUILD_ONEDNN=OFF -C build-dir=build/gpu_check_core \
  > "$LOGS/build_core.log" 2>&1 || { tail -30 "$LOGS/build_core.log"; print_table "$LOGS"; exit 1; }

run_step "build cuDNN wheel ($ARCHS)" "$T_BUILD_CUDA" "$PY" -m pip install --no-build-isolation --no-deps -v \
  ./packaging/flux-dnn-cuda13 -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCHS" \
  -C build-dir=build/gpu_check_cuda \
  > "$LOGS/build_cuda.log" 2>&1 || { tail -30 "$LOGS/build_cuda.log"; print_table "$LOGS"; exit 1; }

run_step "flux_dnn info" "$T_INFO" bash -c "cd /tmp && '$PY' -m flux_dnn info" > "$LOGS/info.txt" 2>&1
cat "$LOGS/info.txt"

PYTEST=("$PY" -m pytest -v -p no:cacheprovider -o addopts="" -W default -rfEs --durations=20
  -o faulthandler_timeout=60)

run_step "tests: ABI, cuDNN" "$T_TESTS" "${PYTEST[@]}" --junitxml="$LOGS/junit_tests.xml" \
  tests/abi tests/test_cudnn.py > "$LOGS/pytest_tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$LOGS/pytest_tests.txt" | head -20

# The conformance suite's GPU part: its backends on devices other than the CPU.
run_step "conformance -m accelerator" "$T_CONFORMANCE" "${PYTEST[@]}" \
  --junitxml="$LOGS/junit_conformance.xml" -m accelerator tests/conformance \
  > "$LOGS/pytest_conformance.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$LOGS/pytest_conformance.txt" | head -30

run_step "benchmark (quick)" "$T_BENCH" "$PY" benchmarks/bench_cuda.py --quick \
  --budget-s "$BENCH_BUDGET_S" --json "$LOGS/bench.json" > "$LOGS/bench.txt" 2>&1 \
  || tail -20 "$LOGS/bench.txt"

for f in pytest_tests pytest_conformance; do
  echo
  echo "--- slowest of $f"
  sed -n '/slowest 20 durations/,/^$/p' "$LOGS/$f.txt" | head -22
done
print_table "$LOGS"
exit $status

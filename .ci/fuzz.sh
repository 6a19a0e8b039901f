#!/usr/bin/env bash
# The C ABI fuzzer (issue 16): every shim library this build installed (tests/abi/shims.py
# finds them, as the ABI suite does) driven through the header's structs with mutated
# convolution descriptions, each batch in a child process. Fixed seeds 1-3 plus one fresh seed
# (printed, so a failure replays), 2000 cases per shim and seed; any crash, hang,
# accepted-invalid input, wrong error code, out field written on error, guard byte changed or
# wrong result (issue 23: every executed valid plan is compared with a float64 reference)
# fails the step, each printed with a one-line reproducer. A shim that cannot plan here (no
# driver) is named and skipped.
# The longer run is one command: python tests/abi_fuzz/fuzz.py --seed <S> --cases 100000
set -euo pipefail
work="$1"
start=$SECONDS
# The MIOpen shim (installed by .ci/rocm.sh) has no MIOpen here: it plans on its test double
# (tests/doubles/miopen, host memory), which checks the argument rules, never AMD GPUs. Its
# "device" memory being host memory, its plans execute too and their results are compared
# (FLUX_DNN_FUZZ_ROCM_DOUBLE=1): the shim's own plumbing and epilogue around the double's
# naive convolution.
if python -c "import flux_dnn_rocm" 2>/dev/null; then
  FLUX_DNN_MIOPEN_LIBRARY="$(python -c "import sys; sys.path.insert(0, 'tests')
from doubles import miopen
print(miopen.build(sys.argv[1]))" "$work/miopen-double")"
  export FLUX_DNN_MIOPEN_LIBRARY FLUX_DNN_FUZZ_ROCM_DOUBLE=1
fi
python tests/abi_fuzz/fuzz.py --json "$work/abi_fuzz_counts.json"
echo "abi fuzz: $((SECONDS - start)) s"

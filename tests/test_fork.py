"""Fork safety of the CPU shims: GNU libgomp's thread team does not survive fork(), so a
child that runs a multi-threaded convolution after its parent did would wait forever for the
parent's threads. The shims notice that they run in a forked child and compute on the calling
thread there. Each check runs in a fresh interpreter, which forks after a large convolution;
a child that does not finish in time is killed and reported."""

import os
import subprocess
import sys

import pytest

import flux_dnn

SCRIPT = r"""
import os, sys, time, warnings
import numpy as np
import flux_dnn

warnings.simplefilter("ignore", DeprecationWarning)  # "fork() in a multi-threaded process"
dtype = np.dtype(sys.argv[1])
rng = np.random.default_rng()
x = rng.integers(-4, 5, (8, 64, 32, 32)).astype(dtype) / 4   # 38 M multiply-adds: a full team
w = rng.integers(-4, 5, (64, 64, 3, 3)).astype(dtype) / 4
expected = flux_dnn.conv2d(x, w, padding=1)                   # the parent's team is started

pid = os.fork()
if pid == 0:
    ok = False
    try:
        y = flux_dnn.conv2d(x, w, padding=1)                  # the cached plan
        dx = flux_dnn.conv_backward_data(y, w, x.shape, padding=1)  # a new plan in the child
        ok = bool(np.array_equal(y, expected)) and dx.shape == x.shape
    finally:
        os._exit(0 if ok else 3)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("hang")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_child_of_a_fork_computes_instead_of_hanging(dtype):
    if not any(s.usable and dtype in s.dtypes for s in flux_dnn.shims() if s.device_type == 1):
        pytest.skip(f"no CPU shim here computes {dtype}")
    result = subprocess.run([sys.executable, "-c", SCRIPT, dtype, "60"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exit", "0"], (result.stdout, result.stderr)

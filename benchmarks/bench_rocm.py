"""The MIOpen shim against torch.nn.functional.conv2d on an AMD GPU (PyTorch ROCm): the
distinct convolutions of ResNet-50 (flux_dnn._bench.RESNET50, as bench_mps.py) at N=32,
float32/float16/bfloat16, NCHW and NHWC, forward and both backwards,
torch.backends.cudnn.benchmark (MIOpen's) set alike, the two libraries' calls interleaved and
timed with events on the GPU (flux_dnn._bench's loop, shared by every flux_dnn benchmark),
medians, ratios (torch time / flux_dnn time; > 1 means flux_dnn is faster) and their geomean.
NOT RUN: no AMD GPU was reachable when it was written (see scripts/rocm_check.sh).

`python benchmarks/bench_rocm.py --host-overhead` runs without an AMD GPU: the MIOpen shim's
per-call host overhead on the test double (tests/doubles/miopen) against the oneDNN shim's."""

import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flux_dnn
from flux_dnn._bench import RESNET50 as LAYERS
from flux_dnn._bench import cuda_events, geomean, interleaved

WARMUP, REPS = 1, 20


def cases(x, w, dy, s, p) -> dict:
    """{op: (torch's call, flux_dnn's call)} for one layer's tensors."""
    kw = {"stride": s, "padding": p}
    return {
        "forward": (lambda: F.conv2d(x, w, **kw), lambda: flux_dnn.conv2d(x, w, **kw, algorithm="benchmark")),
        "backward_data": (
            lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **kw),
            lambda: flux_dnn.conv_backward_data(dy, w, x.shape, **kw, algorithm="benchmark"),
        ),
        "backward_weight": (
            lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **kw),
            lambda: flux_dnn.conv_backward_weight(x, dy, w.shape, **kw, algorithm="benchmark"),
        ),
    }


def main():
    if torch.version.hip is None or not torch.cuda.is_available():
        sys.exit("bench_rocm.py needs PyTorch for ROCm and an AMD GPU")
    torch.backends.cudnn.benchmark = True  # MIOpen's search on ROCm, as flux_dnn's "benchmark"
    timer = cuda_events(torch)  # torch.cuda's events are HIP's on ROCm
    ratios = []
    print(f"{'layer':26} {'dtype':9} {'layout':6} {'op':16} {'torch ms':>9} {'flux ms':>9} {'ratio':>6}")
    for layer in LAYERS:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for layout in ("NCHW", "NHWC"):
                fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                x = torch.randn(32, layer.C, layer.H, layer.H, device="cuda", dtype=dtype).to(memory_format=fmt)
                w = torch.randn(layer.K, layer.C, layer.R, layer.R, device="cuda", dtype=dtype).to(memory_format=fmt)
                dy = torch.randn_like(F.conv2d(x, w, stride=layer.stride, padding=layer.pad))
                for op, (ref, ours) in cases(x, w, dy, layer.stride, layer.pad).items():
                    t = interleaved({"torch": ref, "flux": ours}, 0.0, REPS, REPS, WARMUP, timer=timer)
                    ratios.append(t["torch"] / t["flux"])
                    dt = str(dtype)[6:]
                    print(
                        f"{layer.name:26} {dt:9} {layout:6} {op:16} {t['torch']:9.3f} {t['flux']:9.3f} "
                        f"{ratios[-1]:6.2f}",
                        flush=True,
                    )
    print(f"geomean ratio (torch / flux_dnn, > 1: flux_dnn faster): {geomean(ratios):.3f}")


if __name__ == "__main__" and "--host-overhead" not in sys.argv:
    main()


# ---- here, without an AMD GPU: the shim's per-call host overhead on the test double -------


def host_overhead(calls: int = 20000, repeats: int = 5) -> None:
    """Conv_Plan_Execute of a 1x1x1x1 convolution through ctypes, µs per call (median of
    `repeats` loops of `calls`): the MIOpen shim on the test double against the oneDNN shim,
    and the double's own ConvolutionForwardImmediate alone, so that the shim's part shows."""
    import ctypes as C
    import tempfile

    import numpy as np

    tests = pathlib.Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    from abi import fdnn_ctypes as Fc  # noqa: PLC0415 -- the ABI suite's ctypes mirror
    from doubles import miopen as double  # noqa: PLC0415

    double.use(pathlib.Path(tempfile.gettempdir()) / "flux_dnn_bench_miopen_double")
    import flux_dnn_rocm

    onednn = next(s.path for s in flux_dnn.shims() if s.name == "onednn")
    arrays = {k: np.ones((1, 1, 1, 1), np.float32) for k in ("x", "w", "y")}

    def per_call(path, device):
        shim = Fc.Shim(str(path))
        assert shim.reason() is None, shim.reason()
        t = {k: Fc.tensor(a.shape, device=device, data=a.ctypes.data) for k, a in arrays.items()}
        args = Fc.conv_args(t["x"], t["w"], t["y"])
        assert shim.call("Conv_Plan_Create", args) is None
        ws = np.zeros(args.workspace_size + 64, np.uint8)
        ex = Fc.new(
            Fc.ConvPlanExecuteArgs,
            plan=args.plan,
            workspace=ws.ctypes.data if args.workspace_size else None,
            workspace_size=args.workspace_size,
            **{k: a.ctypes.data for k, a in arrays.items()},
        )
        fn, addr = shim.function("Conv_Plan_Execute"), C.addressof(ex)
        return _loop(lambda: fn(addr), calls, repeats), args.algo_name.decode()

    miopen_us, miopen_algo = per_call(flux_dnn_rocm.LIBRARY, (Fc.ABI.DEVICE_ROCM, 0))
    onednn_us, onednn_algo = per_call(onednn, (Fc.ABI.DEVICE_CPU, 0))
    double_us = _double_alone(double, calls, repeats)
    print(f"Conv_Plan_Execute, 1x1x1x1 float32, µs per call (median of {repeats} x {calls}):")
    print(f"  miopen shim on the double  {miopen_us:7.2f}  ({miopen_algo})")
    print(f"    of which the double's Immediate alone (timed in C++)  {double_us:7.2f}")
    print(f"    so the shim's own part about  {miopen_us - double_us:7.2f}")
    print(f"  onednn shim                {onednn_us:7.2f}  ({onednn_algo})")


def _loop(call, calls, repeats) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


_DOUBLE_ALONE = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "miopen_api.hpp"
extern "C" {
miopenStatus_t miopenCreate(miopenHandle_t*);
miopenStatus_t miopenCreateTensorDescriptor(miopenTensorDescriptor_t*);
miopenStatus_t miopenSetTensorDescriptor(miopenTensorDescriptor_t, miopenDataType_t, int, const int*, const int*);
miopenStatus_t miopenCreateConvolutionDescriptor(miopenConvolutionDescriptor_t*);
miopenStatus_t miopenInitConvolutionNdDescriptor(miopenConvolutionDescriptor_t, int, const int*, const int*,
                                                 const int*, miopenConvolutionMode_t);
miopenStatus_t miopenConvolutionForwardGetSolution(miopenHandle_t, miopenTensorDescriptor_t,
    miopenTensorDescriptor_t, miopenConvolutionDescriptor_t, miopenTensorDescriptor_t, size_t, size_t*,
    miopenConvSolution_t*);
miopenStatus_t miopenConvolutionForwardImmediate(miopenHandle_t, miopenTensorDescriptor_t, const void*,
    miopenTensorDescriptor_t, const void*, miopenConvolutionDescriptor_t, miopenTensorDescriptor_t, void*,
    void*, size_t, uint64_t);
}
int main(int, char** argv) {
  const long calls = std::atol(argv[1]);
  miopenHandle_t h; miopenCreate(&h);
  miopenTensorDescriptor_t d; miopenCreateTensorDescriptor(&d);
  const int one[4] = {1, 1, 1, 1}, zero2[2] = {0, 0}, one2[2] = {1, 1};
  miopenSetTensorDescriptor(d, miopenFloat, 4, one, one);
  miopenConvolutionDescriptor_t c; miopenCreateConvolutionDescriptor(&c);
  miopenInitConvolutionNdDescriptor(c, 2, zero2, one2, one2, miopenConvolution);
  miopenConvSolution_t found[4]; size_t n = 0;
  miopenConvolutionForwardGetSolution(h, d, d, c, d, 4, &n, found);
  float v[1] = {1.f};
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) miopenConvolutionForwardImmediate(h, d, v, d, v, c, d, v, nullptr, 0, 1);
  std::chrono::duration<double, std::micro> t = std::chrono::steady_clock::now() - start;
  std::printf("%f\n", t.count() / calls);
}
"""


def _double_alone(double, calls, repeats) -> float:
    """The double's miopenConvolutionForwardImmediate for the same problem, timed in C++."""
    import subprocess
    import tempfile

    lib = double.build(pathlib.Path(tempfile.gettempdir()) / "flux_dnn_bench_miopen_double")
    src = lib.parent / "double_alone.cpp"
    exe = lib.parent / "double_alone"
    src.write_text(_DOUBLE_ALONE)
    include = f"-I{double.INCLUDES[0]}"
    subprocess.run(
        ["c++", "-O2", "-std=c++17", include, str(src), str(lib), f"-Wl,-rpath,{lib.parent}", "-o", str(exe)],
        check=True,
    )
    runs = [
        float(subprocess.run([str(exe), str(calls)], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeats)
    ]
    return statistics.median(runs)


if __name__ == "__main__" and "--host-overhead" in sys.argv:
    host_overhead()

"""python -m flux_dnn info | demo | bench"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    """Lists every shim (one that failed to load with its reason), then per device type the
    order in which shims are asked and which serves each dtype here. Never raises."""
    import flux_dnn

    print(f"flux_dnn {flux_dnn.__version__}, ABI {flux_dnn.ABI_VERSION[0]}.{flux_dnn.ABI_VERSION[1]}")
    _print_packages(flux_dnn.__version__)
    _print_providers()
    statuses = flux_dnn.shims()
    if not statuses:
        print("no shims installed")
        return 1
    for s in statuses:
        _print_shim(s)
    _print_serving(statuses)
    return 0


def _print_packages(core_version: str) -> None:
    """The installed flux-dnn distributions (the core and its plug-in wheels) and their
    versions; a plug-in of another major.minor than the core is flagged (pip's pin,
    flux-dnn~=X.Y.Z, keeps them together; --no-deps installs can part them)."""
    import importlib.metadata
    import re

    found = {}
    for dist in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name == "flux-dnn" or name.startswith("flux-dnn-"):
            found[name] = dist.version
    if not found:
        print("packages: none installed (flux_dnn imported from a source tree)")
        return
    core_series = core_version.split(".")[:2]
    for name, version in sorted(found.items(), key=lambda item: (item[0] != "flux-dnn", item[0])):
        mismatch = name != "flux-dnn" and version.split(".")[:2] != core_series
        note = f"  (the core is {core_version}: pip install '{name}~={core_version}')" if mismatch else ""
        print(f"  package {name} {version}{note}")


def _print_providers() -> None:
    """The array libraries with a provider of their own (entry-point group flux_dnn.providers,
    by the package that registers them; none is loaded here); others go through DLPack and
    the array API."""
    import importlib.metadata

    from .providers import ENTRY_POINT_GROUP

    by_package: dict = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = ep.dist.name if ep.dist is not None else "?"
        by_package.setdefault(package, []).append(ep.name)
    listed = "; ".join(f"{', '.join(names)} ({package})" for package, names in by_package.items())
    print(f"  arrays: {listed or 'none registered'}; any other array through DLPack and the array API")


def _print_shim(s) -> None:
    from ._discovery import flag_names

    state = "usable" if s.usable else ("loaded, unavailable" if s.loaded else "not loaded")
    print(f"\nshim {s.name} [{s.device}]: {state}")
    if s.vendor:
        print(f"  vendor:   {s.vendor} {s.vendor_version_runtime} (built against {s.vendor_version_built})")
    if s.loaded:
        abi = ".".join(map(str, s.abi))
        print(f"  shim:     version {s.shim_version or '?'}, ABI {abi}, priority {s.priority}")
        print(f"  devices:  {s.num_devices}")
    if s.usable:
        print(f"  device 0: {s.device_name}, default flags {flag_names(s.default_flags)}")
    for dtype, (how, detail) in s.dtype_support.items():
        print(f"  {dtype + ':':9} {how}" + (f" ({detail})" if detail else ""))
    if s.verification:
        print(f"  verified: {s.verification}")
    if s.path:
        print(f"  library:  {s.path}")
    if s.reason:
        print(f"  why not:  {s.reason}")
        if s.install_hint:
            print(f"  to fix:   {s.install_hint}")


def _print_serving(statuses) -> None:
    """Per device type: the order shims are asked in (with each one's priority, version and
    default flags), and the shim a convolution of each dtype goes to here (what dispatch
    picks, from what the shims report)."""
    from ._discovery import REGISTRY, device_name

    for device_type in sorted({s.device_type for s in statuses if s.usable}):
        print(f"\n{device_name(device_type)} arrays:")
        try:
            _print_device_serving(REGISTRY.usable_for(device_type, loud=False)[0])
        except Exception as exc:  # noqa: BLE001 -- a shim failing to answer is shown, not raised
            print(f"  error:    {type(exc).__name__}: {exc}")


def _print_device_serving(usable: list) -> None:
    from . import _core
    from ._discovery import DTYPES, flag_names

    order = ", ".join(
        f"{e.name} (priority {e.priority}, version {e.info['shim_version'] or '?'}, "
        f"default flags {flag_names(e.default_flags())})"
        for e in usable
    )
    print(f"  order:    {order}")
    for dtype in DTYPES:
        serving = [e for e in usable if e.computes(dtype)]
        if not serving:
            print(f"  {dtype + ':':9} not supported")
            continue
        how = serving[0].capabilities(_core.CONV_FORWARD, dtype)["support"]
        print(f"  {dtype + ':':9} {serving[0].name}" + (" (converted)" if how == _core.SUPPORT_CONVERTED else ""))


def demo() -> int:
    """A 3x3 convolution with bias and ReLU on NumPy arrays, one output channel checked against
    float64; it names the shim that served the call (the plan's own, not the first listed)."""
    import time

    import numpy as np

    import flux_dnn

    rng = np.random.default_rng()
    x = rng.standard_normal((8, 64, 56, 56), dtype=np.float32)
    w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.05
    b = rng.standard_normal(64, dtype=np.float32)
    plan = flux_dnn.conv_plan(x, w, b, padding=1, activation="relu")  # as conv2d picks its shim
    y = plan(x)
    t0 = time.perf_counter()
    y = plan(x)
    dt = time.perf_counter() - t0
    # Check one output channel against a direct NumPy sum in float64.
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    k = 5
    ref = (
        sum(
            np.einsum("nchw,c->nhw", xp[:, :, r : r + 56, s : s + 56], w[k, :, r, s].astype(np.float64))
            for r in range(3)
            for s in range(3)
        )
        + b[k]
    )
    err = np.abs(y[:, k] - np.maximum(ref, 0)).max()
    shim = next(s for s in flux_dnn.shims() if s.name == plan.shim)
    print(
        f"conv2d 8x64x56x56 * 64x64x3x3 + bias, relu on NumPy arrays via the {shim.name} shim ({shim.vendor} "
        f"{shim.vendor_version_runtime}, {plan.algorithm}): output {type(y).__name__} {y.shape} {y.dtype}, "
        f"{dt * 1e3:.2f} ms, {2 * y.size * 64 * 9 / dt / 1e9:.1f} GFLOP/s, max |error| vs float64 = {err:.2e}"
    )
    return 0 if err < 1e-3 else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own options: python -m flux_dnn bench --help
        from ._bench_cli import main as bench

        return bench(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m flux_dnn")
    parser.add_argument(
        "command",
        choices=["info", "demo", "bench"],
        help="info: list shims; demo: run a convolution on NumPy arrays; "
        "bench: time flux_dnn against torch, JAX or NumPy (bench --help)",
    )
    args = parser.parse_args(argv)
    return {"info": info, "demo": demo}[args.command]()


if __name__ == "__main__":
    sys.exit(main())

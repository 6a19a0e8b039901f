"""The conformance suite: every usable shim, on every installed array library that holds its
device's arrays, through flux_dnn's public API, against the float64 reference (reference.py).

- conftest.py discovers the backends (shim x array library) and generates one test per
  backend; it pins the dispatcher to the backend's shim (test pinning) and holds the one
  function that asks a shim what it can do (``shim_capabilities``).
- libraries.py: one small class per array library: flux-dnn's own (NumPy, PyTorch, JAX,
  CuPy, MLX) and those installed plug-ins register (entry-point group
  ``flux_dnn.conformance_libraries``; base class flux_dnn.conformance.ArrayLibrary).
- problems.py: random problems, the op drivers and the comparison with the reference.
- test_matrix.py: ops x 1/2/3-D x dtypes x layouts, every feature and activation.
- test_numerics.py: gradients as VJPs, rounding, strided views, precision and determinism
  flags, workspace, streams, threads, fork, autotune.
- test_frameworks.py: autograd through flux_dnn.torch and flux_dnn.jax.
- test_accelerators.py: what every shim of a device other than the CPU must get right
  (threads, misaligned pointers, views with gaps, stride 0, workspace fallbacks, ...), run
  on each accelerator shim; test_cuda.py, test_rocm.py, test_metal.py: one vendor's own.
- test_vendor_switches.py: checks that drive a vendor's own environment switches.
- test_pinning.py: the pin itself routes calls to the pinned shim only.
- test_known_defects.py: defects of flux_dnn or a vendor that the suite found, one strict
  xfail each; the random draws keep clear of them (problems.KNOWN_DEFECTS).

A new shim needs no edit here: it is found through flux_dnn.shims(), and what it claims
(its capabilities) decides what runs on it; a new array library registers itself.

A case a shim does not claim is skipped with the shim's own words; a claimed case must pass.
``python -m pytest tests/conformance -m accelerator`` runs only the backends of devices other
than the CPU (scripts/gpu_check.sh)."""

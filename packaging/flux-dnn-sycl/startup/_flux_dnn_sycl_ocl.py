"""Run at interpreter start-up by flux_dnn_sycl.pth (installed beside it in site-packages):
points the OpenCL ICD loader at intel-opencl-rt's CPU runtime, so that the SYCL runtime lists
the CPU as an OpenCL device however the user's program begins (dpnp or dpctl before
flux_dnn included). Costs one stat; imports nothing but os.

Why (flux_dnn_sycl/_runtime.py): the wheel's .icd file holds a placeholder path, and the
loader reads OCL_ICD_FILENAMES once, when the SYCL runtime first lists devices. A value the
user set is extended, never replaced. Data files of wheels lie in <prefix>/lib, three levels
above <prefix>/lib/pythonX.Y/site-packages (venvs, --user and --prefix installs alike)."""

import os


def _configure():
    lib = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libintelocl.so"))
    if not os.path.exists(lib):
        return
    entries = [e for e in os.environ.get("OCL_ICD_FILENAMES", "").split(":") if e]
    # The wheel ships the runtime as libintelocl.so and libintelocl.so.<version>: naming it
    # twice would list the CPU twice.
    here = os.path.dirname(lib)
    named = any(
        os.path.basename(e).startswith("libintelocl.so") and os.path.realpath(os.path.dirname(e)) == here
        for e in entries
    )
    if not named:
        os.environ["OCL_ICD_FILENAMES"] = ":".join([*entries, lib])


_configure()

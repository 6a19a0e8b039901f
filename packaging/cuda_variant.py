"""Writes the flux-dnn-cuda<MAJOR> wheel project from flux-dnn-cuda13, the one kept in git.

    python packaging/cuda_variant.py 12      # -> packaging/flux-dnn-cuda12/
    pip wheel packaging/flux-dnn-cuda12      # with a CUDA 12 toolkit's nvcc on the PATH

The projects differ only in the CUDA major: package and distribution names, the
nvidia-cudnn-cu<MAJOR> dependency (cuDNN's headers at build time, libcudnn.so.9 at run
time). CMake picks the CUDA toolkit from the PATH and the matching cuDNN wheel from its
major (csrc/shims/cudnn/CMakeLists.txt).
"""

import pathlib
import shutil
import sys

TEMPLATE_MAJOR = "13"


def main() -> None:
    major = sys.argv[1] if len(sys.argv) > 1 else ""
    if not major.isdigit():
        sys.exit("usage: cuda_variant.py MAJOR   (e.g. 12)")
    here = pathlib.Path(__file__).resolve().parent
    source = here / f"flux-dnn-cuda{TEMPLATE_MAJOR}"
    target = here / f"flux-dnn-cuda{major}"
    if target == source:
        sys.exit(f"flux-dnn-cuda{major} is the template itself")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("build", "__pycache__"))
    (target / f"flux_dnn_cuda{TEMPLATE_MAJOR}").rename(target / f"flux_dnn_cuda{major}")
    for name in ("pyproject.toml", "README.md"):
        path = target / name
        text = path.read_text().replace(f"cuda{TEMPLATE_MAJOR}", f"cuda{major}")
        text = text.replace(f"cu{TEMPLATE_MAJOR}", f"cu{major}")
        text = text.replace(f"CUDA {TEMPLATE_MAJOR}", f"CUDA {major}")
        path.write_text(text)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

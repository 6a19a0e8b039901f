"""Where the flux_dnn XLA FFI handler lies; flux_dnn.jax loads it from here.

Importing it checks that the installed flux_dnn core speaks the ABI major the handler was
built for (ImportError naming both versions otherwise): the handler loads the core's shims."""

import pathlib

from ._build_info import VERSION, require_core_abi

require_core_abi(__name__)

__version__ = VERSION
LIBRARY = pathlib.Path(__file__).with_name("libflux_dnn_jax_ffi.so")

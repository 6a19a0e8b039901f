"""Where the flux_dnn XLA FFI handler lies; flux_dnn.jax loads it from here."""

import pathlib

LIBRARY = pathlib.Path(__file__).with_name("libflux_dnn_jax_ffi.so")

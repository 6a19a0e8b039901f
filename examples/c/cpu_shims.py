"""Prints the library of each CPU shim installed with flux_dnn, one path a line, for the C
example to run against (`make run`). Loads nothing: the paths come from the shims'
registrations (entry points), the device type from the ABI header through flux_dnn._core."""

import os

import flux_dnn
from flux_dnn import _core

for shim in flux_dnn.shims(load=False):
    if shim.device_type == _core.DEVICE_CPU and os.path.isfile(shim.path):
        print(shim.path)

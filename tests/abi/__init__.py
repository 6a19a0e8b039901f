"""The ABI suite: the C ABI of csrc/include/flux_dnn/flux_dnn.h, checked through ctypes on
every shim library (shims.py finds them): test_abi.py for what every shim owes the header,
test_<vendor>_specific.py for what only one shim does."""

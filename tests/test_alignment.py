"""The plan cache keys on the alignment of the data (up to 16 bytes): GPU shims (cuDNN)
choose kernels that assume it, so an offset view must not reuse a plan made for an aligned
array. Checked on the CPU shim, where the cache is the same."""

import numpy as np

import flux_dnn
import reference as ref


def test_offset_view_gets_its_own_plan(rng):
    n = 2 * 4 * 8 * 8
    buffer = rng.standard_normal(n + 1).astype(np.float32)
    aligned = buffer[:n].reshape(2, 4, 8, 8)
    offset = buffer[1:].reshape(2, 4, 8, 8)  # 4 bytes past an aligned start
    assert aligned.ctypes.data % 16 == 0 and offset.ctypes.data % 16 == 4
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    flux_dnn.clear_plan_cache()
    before = flux_dnn.plan_cache_info()
    results = [flux_dnn.conv2d(x, w, padding=1) for x in (aligned, offset, offset)]
    after = flux_dnn.plan_cache_info()
    assert after["misses"] - before["misses"] == 2, after
    assert after["hits"] - before["hits"] == 1, after
    for x, y in zip((aligned, offset), results):
        expected = ref.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1), (1, 1), 1)
        np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-4 * np.abs(expected).max())

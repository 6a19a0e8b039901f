"""The SYCL providers' output pool (flux_dnn_sycl.providers._OutputPool, issue 28): dpnp and
dpctl outputs of flux_dnn take USM memory back from outputs no array uses any more, so a
repeated call does not fault in fresh pages every time.

What must hold, each checked against float64 with fresh random inputs:
- a block is reused only when no array, view or queued dpnp operation refers to it: outputs
  alive (or viewed) keep their values through later calls, and a dpnp kernel queued on a
  dropped output reads the convolution's values, not a later call's;
- a reused block is written whole (it is poisoned with NaN before it is dropped);
- FLUX_DNN_SYCL_OUTPUT_POOL_BYTES bounds the pool, 0 turns it off, a bad value is refused
  with its name; release_output_pool frees idle blocks only.

Each script runs in a fresh interpreter: a pytest process that imports dpnp beside the ctypes
-loaded shim of test_onednn_sycl.py crashes at exit in the SYCL runtime's teardown (that
file's test_chain_of_flux_dnn_calls_without_host_wait says more)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def _unavailable():
    for module in ("flux_dnn_sycl", "dpnp"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def run_script(body: str, **env) -> str:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    code = _PRELUDE.format(paths=[str(HERE)]) + textwrap.dedent(body)
    environ = {k: v for k, v in os.environ.items() if k != "FLUX_DNN_SYCL_BLOCKING"}
    environ.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE, env=environ, timeout=300)
    assert r.returncode == 0 and "script ok" in r.stdout, r.stdout + r.stderr
    return r.stdout


_PRELUDE = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    sys.path[:0] = {paths!r}
    warnings.simplefilter("ignore", DeprecationWarning)
    import dpctl, dpnp, flux_dnn, flux_dnn_sycl, reference as ref

    q = dpnp.empty(1).sycl_queue  # dpnp's default queue: out of order
    rng = np.random.default_rng()

    def problem(n=2, c=8, k=8, size=40):  # outputs of 100 KiB: pooled (64 KiB and more)
        x = rng.standard_normal((n, c, size, size)).astype(np.float32)
        w = rng.standard_normal((k, c, 3, 3)).astype(np.float32) / 8
        want = ref.conv_forward(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (1, 1), (1, 1))
        return dpnp.asarray(x, sycl_queue=q), dpnp.asarray(w, sycl_queue=q), want

    def pointer(a):
        return a.get_array().usm_data._pointer

    def check(got, want, what):
        got = dpnp.asnumpy(got)
        assert not np.isnan(got).any(), what
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < 1e-5, (what, err)
    """
)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_dropped_output_is_reused_and_written_whole(layout):
    """An output poisoned with NaN and dropped: a later output of the same size and layout
    takes its memory (after its call's work has run), every later result is right, and the
    block is the pool's (release_output_pool frees it once the last output is dropped).
    Channels-last: the input in channels-last strides, so the output is too."""
    out = run_script(
        f"""
        def make():
            x, w, want = problem()
            if {layout!r} == "channels_last":
                x = dpnp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
            return x, w, want

        x, w, want = make()
        y = flux_dnn.conv2d(x, w, padding=1)
        assert ({layout!r} == "channels_last") == (y.strides[1] == 1), y.strides
        check(y, want, "first")
        first, nbytes = pointer(y), y.size * y.itemsize
        first_memory = id(y.get_array().usm_data)  # the pool keeps it: its id is not reused
        y[...] = np.nan  # what a reused block holds, if the next call left elements unwritten
        del y
        q.wait()
        seen = []
        for i in range(4):
            x, w, want = make()
            y = flux_dnn.conv2d(x, w, padding=1)
            check(y, want, i)
            seen.append(pointer(y))
            if seen[-1] == first:  # the block's dpctl memory object is made once, then shared
                assert id(y.get_array().usm_data) == first_memory, "a new memory object for a pooled block"
        assert first in seen, "a dropped output's memory was never reused"
        del y
        q.wait()
        assert flux_dnn_sycl.release_output_pool() >= nbytes, "the outputs' blocks were not the pool's"
        print("reused after", seen.index(first) + 1, "calls")
        print("script ok")
        """
    )
    assert "reused after" in out


def test_live_outputs_and_views_keep_their_memory():
    """Outputs still referenced, one of them only through a view of it, keep their values
    through twelve later calls of the same size, none of which gets their memory."""
    run_script(
        """
        kept, views, pointers = [], [], set()
        for i in range(4):
            x, w, want = problem()
            y = flux_dnn.conv2d(x, w, padding=1)
            kept.append((y, want))
            pointers.add(pointer(y))
        x, w, want = problem()
        y = flux_dnn.conv2d(x, w, padding=1)
        views.append((y[1:], want[1:]))
        pointers.add(pointer(y))
        del y
        for i in range(12):
            x, w, want = problem()
            y = flux_dnn.conv2d(x, w, padding=1)
            assert pointer(y) not in pointers, i
            check(y, want, i)
        for i, (y, want) in enumerate(kept + views):
            check(y, want, ("kept", i))
        print("script ok")
        """
    )


def test_queued_dpnp_work_on_a_dropped_output_reads_its_values():
    """z = 2 * y + 1 is queued on dpnp's out-of-order queue, y dropped at once, and calls of the
    same size follow with no wait: they must not take y's memory before z has read it
    (dpctl keeps an operation's arrays referenced until its work has run)."""
    run_script(
        """
        for rep in range(5):
            x, w, want = problem(n=4, c=16, k=16, size=40)
            y = flux_dnn.conv2d(x, w, padding=1)
            z = 2 * y + 1
            del y
            later = [problem(n=4, c=16, k=16, size=40) for _ in range(3)]
            outs = [flux_dnn.conv2d(a, b, padding=1) for a, b, _ in later]
            check(z, 2 * want + 1, ("z", rep))
            for i, (o, (_, _, lw)) in enumerate(zip(outs, later)):
                check(o, lw, ("later", rep, i))
        print("script ok")
        """
    )


def test_release_frees_idle_blocks_only():
    """release_output_pool frees the blocks of dropped outputs (returns their bytes) and
    keeps a live output's; the live output keeps its values and later calls are right."""
    run_script(
        """
        x, w, want = problem()
        live = flux_dnn.conv2d(x, w, padding=1)
        dropped = [flux_dnn.conv2d(*problem()[:2], padding=1) for i in range(3)]
        del dropped
        q.wait()
        nbytes = live.size * live.itemsize
        freed = flux_dnn_sycl.release_output_pool()
        assert freed == 3 * nbytes, (freed, nbytes)  # the three dropped outputs' blocks
        check(live, want, "live")
        assert flux_dnn_sycl.release_output_pool() == 0
        x, w, want = problem()
        check(flux_dnn.conv2d(x, w, padding=1), want, "after")
        print("script ok")
        """
    )


def test_pool_off_and_bounded():
    """FLUX_DNN_SYCL_OUTPUT_POOL_BYTES=0: no output's memory is kept (nothing to release);
    a limit of one output: outputs beyond it are allocated apart, all right and distinct
    while alive."""
    body = """
        x, w, want = problem()
        nbytes = 2 * 8 * 40 * 40 * 4
        outs = []
        for i in range(4):
            x, w, want = problem()
            outs.append((flux_dnn.conv2d(x, w, padding=1), want))
        assert len({pointer(y) for y, _ in outs}) == 4
        for i, (y, want) in enumerate(outs):
            check(y, want, i)
        del outs, y
        q.wait()
        print("released", flux_dnn_sycl.release_output_pool(), "of", nbytes)
        print("script ok")
        """
    out = run_script(body, FLUX_DNN_SYCL_OUTPUT_POOL_BYTES="0")
    assert "released 0 of" in out, out
    nbytes = 2 * 8 * 40 * 40 * 4
    out = run_script(body, FLUX_DNN_SYCL_OUTPUT_POOL_BYTES=str(nbytes))
    assert f"released {nbytes} of" in out, out  # the first output's block only


def test_small_outputs_are_not_pooled():
    """Outputs under 64 KiB are allocated by dpctl as before: nothing is kept for them."""
    run_script(
        """
        for i in range(3):
            x, w, want = problem(size=16)  # 8 KiB outputs
            check(flux_dnn.conv2d(x, w, padding=1), want, i)
        q.wait()
        assert flux_dnn_sycl.release_output_pool() == 0
        print("script ok")
        """
    )


def test_bad_pool_size_is_refused_with_its_name():
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    code = _PRELUDE.format(paths=[str(HERE)]) + "flux_dnn.conv2d(*problem()[:2])\n"
    env = dict(os.environ, FLUX_DNN_SYCL_OUTPUT_POOL_BYTES="-5")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE, env=env, timeout=300)
    assert r.returncode != 0
    assert "FLUX_DNN_SYCL_OUTPUT_POOL_BYTES='-5'" in r.stderr and "0 or more" in r.stderr, r.stderr

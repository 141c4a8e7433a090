"""launch.bench.kernels: both sides compute the same chains; the table and the CLI's checks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from launch.bench import kernels as bk


def test_each_kernel_computes_the_same_chain_on_both_sides():
    rows = bk.measure([128], chain=3, calls=1, repeats=1)
    assert [r["kernel"] for r in rows] == list(bk.KERNELS)
    for r in rows:
        assert r["shape"] == [128, bk.WIDTH]
        assert r["jax_us"] > 0 and r["torch_us"] > 0
        assert r["torch_over_jax"] == pytest.approx(r["torch_us"] / r["jax_us"])
        assert r["max_abs_diff"] < 1e-4, r  # the same function, up to float rounding
    table = bk.table(rows, "1")
    assert table.count("| 128x64 | 1 |") == len(bk.KERNELS)


def test_a_chain_applies_its_kernel_chain_times():
    import jax

    ops = bk.operands(64)
    args = (ops.x, ops.bias, ops.weight, ops.keys)
    once = np.asarray(bk.jax_chain("softmax", 1)(*args))
    np.testing.assert_allclose(once, np.asarray(jax.nn.softmax(ops.x, axis=-1)), rtol=1e-6)
    twice = np.asarray(bk.jax_chain("softmax", 2)(once, *args[1:]))
    np.testing.assert_allclose(twice, np.asarray(bk.jax_chain("softmax", 3)(*args)), rtol=1e-6)
    # The weight is orthogonal: a product chain keeps every row's norm.
    prod = np.asarray(bk.jax_chain("matmul_64x64", 5)(*args))
    np.testing.assert_allclose(
        np.linalg.norm(prod, axis=1), np.linalg.norm(ops.x, axis=1), rtol=1e-4
    )
    # The keys have orthonormal columns: the attention products give back their queries.
    attended = np.asarray(bk.jax_chain("attention_products", 5)(*args))
    np.testing.assert_allclose(attended, ops.x, atol=1e-4)


def test_every_chain_keeps_its_scale_over_the_benchmarks_length():
    """No chain overflows or sinks to denormals over CHAIN applications (either would time
    something else than the kernel)."""
    ops = bk.operands(128)
    args = (ops.x, ops.bias, ops.weight, ops.keys)
    for kernel in bk.KERNELS:
        out = np.asarray(bk.jax_chain(kernel, bk.CHAIN)(*args))
        assert np.isfinite(out).all(), kernel
        nonzero = np.abs(out[out != 0])
        assert nonzero.max() < 1e3 and np.median(nonzero) > 1e-3, kernel


def test_rows_that_are_not_whole_sentences_are_refused():
    with pytest.raises(ValueError, match=r"rows \[100\]: give positive multiples of 64"):
        bk.measure([128, 100], chain=1, calls=1, repeats=1)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--kernel_rows", "512,100"], "give positive multiples of 64"),
        (["--kernel_chains", "1"], "--kernel_chains=1: give 0 (skip) or 2 or more"),
    ],
)
def test_the_cli_refuses_bad_values_in_one_line_before_timing(flag, message):
    out = subprocess.run(
        [sys.executable, "-m", "launch.bench.kernels", *flag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_independent_chains_compute_each_chain_alone():
    """The independent program is the serial chain run once per input, nothing merged."""
    ops = [bk.operands(64, seed=i) for i in range(3)]
    shared = (ops[0].bias, ops[0].weight, ops[0].keys)
    for kernel in ("softmax", "attention_products"):
        together = bk.jax_independent_chains(kernel, 4)([o.x for o in ops], *shared)
        assert len(together) == 3
        for o, out in zip(ops, together, strict=True):
            alone = bk.jax_chain(kernel, 4)(o.x, *shared)
            np.testing.assert_allclose(np.asarray(out), np.asarray(alone), rtol=1e-6)
        # distinct seeds: the chains do not compute the same thing
        assert not np.allclose(np.asarray(together[0]), np.asarray(together[1]))


def test_concurrency_rows_and_table():
    rows = bk.concurrency([64], kernels=("bias_relu",), chains=2, chain=2, calls=1, repeats=1)
    assert len(rows) == 1
    r = rows[0]
    assert r["kernel"] == "bias_relu" and r["shape"] == [64, bk.WIDTH] and r["chains"] == 2
    assert r["serial_us"] > 0 and r["independent_us"] > 0
    assert r["gain"] == pytest.approx(r["serial_us"] / r["independent_us"])
    assert "| bias_relu | 64x64 | 2 | 2 |" in bk.concurrency_table(rows, "2")
    with pytest.raises(ValueError, match="give 2 or more independent chains"):
        bk.concurrency([64], chains=1)

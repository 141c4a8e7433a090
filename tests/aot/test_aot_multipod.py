"""The headline AOT check: BERT-large (mlperf_v07: 24 stacked layers, GBS 8192,
seq 512, LAMB, weight-update sharding) compiled by the real TPU compiler (libtpu) for
the 4096-chip TPU-v3 multipod, v3:64x64 = 8192 cores, at the config's data=2048 x
model=4 mesh, on this CPU machine. Nothing is allocated."""

from __future__ import annotations

import pytest

from configs.bert import get_config
from mlperf.inspection import inspect_config
from mlperf.tasks import get_task

pytestmark = pytest.mark.xdist_group("aot")
GiB = 1 << 30


@pytest.fixture(autouse=True)
def _release_traces():
    """Each test's full-size programs are traced once; dropping JAX's caches after it keeps
    a process that runs several of this module's tests (`pytest -m slow` on the module;
    `make test-system` gives each its own process) from holding every one."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.mark.slow  # ~2.6 min (157 s alone), 11.4 GB peak resident: the step for 8192 cores
def test_bert_large_compiles_for_the_4096_chip_multipod_and_fits():
    config = get_config("mlperf_v07")
    assert config.model.scan_layers and config.parallel.weight_update_sharding
    # The stack's scan unrolled whole, nothing recomputed (docs/performance.md).
    assert config.model.scan_unroll == 0 and not config.model.remat
    report = inspect_config(config, topology="v3:64x64")
    assert report["devices"] == 8192 and report["mesh"] == {"data": 2048, "model": 4}
    train = report["train"]
    assert "error" not in train, train.get("error")
    # No loop: the compiler's estimate is the whole step's, not an extrapolation.
    assert "layer_step_s" not in train and train["estimated_step_s"] == train["compiler_step_s"]
    # Measured 43.85 ms (libtpu 0.0.42.1): under the 48.1 ms per step of Google's v0.7
    # logs (the device's pace, docs/performance.md "TPU step time").
    assert 0.030 < train["estimated_step_s"] < 0.0481
    per_device = report["bytes_per_device"]
    # Measured 1.84 GB per core of the 16 GiB HBM: params 345 MB (a quarter: model=4),
    # optimizer state 1.9 MB (WUS over data=2048), temporaries 1.15 GB.
    assert report["fits"] and per_device["total"] < 4 * GiB
    assert per_device["params"] < report["bytes_total"]["params"] / 3.5
    # WUS: the optimizer state is sharded over data too (replicated: 689 MB per core).
    assert per_device["opt_state"] < report["bytes_total"]["opt_state"] / 4 / 300
    assert train["gather_scatter"] == 0  # einsum embeddings and masked positions
    # FLOPs count all 24 layers and agree with the analytic count of the same step: 8192
    # examples on 8192 cores, so one example's FLOPs per core.
    task = get_task(config)
    analytic = task.flops_per_example(task.phases()[0])
    assert 0.9 < train["matmul_flops_per_device"] / analytic < 1.1, (train, analytic)
    # XLA's own count sees every layer too (a loop's body it would count once): measured
    # 1.167e12 against 1.141e12.
    assert 0.95 < train["flops_cost_analysis"] / train["flops_per_device"] < 1.05


@pytest.mark.slow  # ~1 min: four small TPU compiles of a tiny BERT on v3:2x2
def test_a_scanned_stack_is_estimated_like_the_unrolled_program():
    """XLA's step-time estimate sees a loop body once; for a scanned layer stack inspect
    extrapolates unrolled 1- and 2-layer compiles to the depth, which must agree with the
    unrolled program's own estimate (measured: per-layer estimates are linear)."""
    reports = {}
    for scan, unroll in ((True, 1), (False, 1), (True, 0)):
        config = get_config("tiny")
        config.model.update(num_layers=6, scan_layers=scan, scan_unroll=unroll)
        config.mesh.ici_shape = (2, 4)
        reports[scan, unroll] = inspect_config(config, topology="v3:2x2")["train"]
    scanned, unrolled, whole = reports[True, 1], reports[False, 1], reports[True, 0]
    assert "layer_step_s" in scanned and "layer_step_s" not in unrolled
    assert scanned["compiler_step_s"] < 0.6 * unrolled["estimated_step_s"]  # one layer seen
    assert scanned["estimated_step_s"] == pytest.approx(unrolled["estimated_step_s"], rel=0.05)
    # The stack unrolled whole (scan_unroll=0) has no loop: compiled as it is, no
    # extrapolation, and it costs what the unrolled program does.
    assert "layer_step_s" not in whole
    assert whole["estimated_step_s"] == pytest.approx(unrolled["estimated_step_s"], rel=0.05)


@pytest.mark.slow  # ~2.3 min (138 s alone), 10.6 GB peak resident: the step for 4096 v4 chips
def test_bert_large_compiles_for_a_4096_chip_v4_pod_in_megacore_mode():
    """The same config on a current generation at the same chip count: v4:16x16x16,
    one JAX device per chip (megacore), model=4 on four neighbours along x."""
    config = get_config("mlperf_v07")
    report = inspect_config(config, topology="v4:16x16x16", layer_estimate=False)
    assert report["devices"] == 4096 and report["chips"] == 4096
    assert report["device_kind"] == "TPU v4" and report["mesh"] == {"data": 1024, "model": 4}
    assert report["mesh_mapping"].startswith("model=4 <- x 4; data=1024 <- x 4 x y 16 x z 16")
    train = report["train"]
    assert "error" not in train, train.get("error")
    assert report["fits"] and report["hbm_per_device"] == 32 * GiB
    assert train["gather_scatter"] == 0
    assert train["estimated_step_s"] > 0  # the roofline: libtpu's v4 estimate is negative
    # 8192 examples on 4096 chips, each model group of 4 splitting its examples' FLOPs:
    # two examples' FLOPs per chip.
    task = get_task(config)
    analytic = task.flops_per_example(task.phases()[0]) * 8192 / 4096
    assert 0.9 < train["matmul_flops_per_device"] / analytic < 1.1, (train, analytic)


@pytest.mark.slow  # ~1.3 min (74 s alone), the train step for 512 chips in two slices
def test_bert_large_compiles_for_two_v6e_slices_joined_over_dcn():
    """A current generation's multi-slice program at full size: two v6e:16x16 slices
    (512 chips), `data` spanning the slices over DCN and model=4 inside each; fits the
    32 GiB per chip, and the collectives that cross slices are the gradient reduction's.
    The layer stack looped and rematerialised, the form for 64 sequences per chip when
    the default's does not fit: it compiles in a quarter of the default's time (288 s alone;
    the default's row is in docs/tpu-table.md)."""
    config = get_config("mlperf_v07")
    config.model.update(scan_unroll=1, remat=True, remat_policy="dots_no_batch")
    report = inspect_config(config, topology="v6e:16x16", slices=2, layer_estimate=False)
    assert report["devices"] == 512 and report["chips"] == 512 and report["slices"] == 2
    assert report["device_kind"] == "TPU v6 lite" and report["mesh"] == {"data": 128, "model": 4}
    assert report["mesh_mapping"].endswith("DCN: data x 2 slices")
    train = report["train"]
    assert "error" not in train, train.get("error")
    assert report["fits"] and report["hbm_per_device"] == 32 * GiB
    assert train["gather_scatter"] == 0
    assert train["dcn_collectives"].get("all-reduce", 0) > 0 and train["dcn_wire_bytes"] > 0
    # 8192 examples on 512 chips, each model group of 4 splitting its 64 examples:
    # sixteen examples' FLOPs per chip.
    task = get_task(config)
    analytic = task.flops_per_example(task.phases()[0]) * 8192 / 512
    assert 0.9 < train["matmul_flops_per_device"] / analytic < 1.1, (train, analytic)


@pytest.mark.slow  # ~1 min: three small TPU compiles of a tiny BERT on v3:2x2
def test_the_scan_method_reads_one_layer_off_the_scanned_program():
    """`layer_estimate="scan"` compiles the scanned step again with two layers per loop
    iteration: the difference is one layer. It is the scanned program's figure, not the
    unrolled program's: without remat the scan stores each layer's residuals in stacked
    buffers that the unrolled program fuses away, so it costs more (measured for this
    tiny BERT: 1.84 ms against 0.85 ms; docs/performance.md "TPU step time")."""
    reports = {}
    for method in ("scan", False):
        config = get_config("tiny")
        config.model.update(num_layers=6, scan_layers=bool(method))
        config.mesh.ici_shape = (2, 4)
        reports[method] = inspect_config(config, topology="v3:2x2", layer_estimate=method)
    scan, unrolled = reports["scan"]["train"], reports[False]["train"]
    assert scan["estimate_method"].startswith("scanned program with 1 and 2 layers")
    one, two = scan["scan_unroll_1_2_step_s"]
    assert one == scan["compiler_step_s"] and two > one
    assert scan["estimated_step_s"] == pytest.approx(one + 5 * (two - one))
    assert scan["estimated_step_s"] > unrolled["estimated_step_s"]


# ~1 min (62 s alone), 2.9 GB peak resident: the train step of a 116B-parameter BERT whose
# 64 layers are a loop (unrolled whole: 333-467 s and 16.1 GB).
@pytest.mark.slow
def test_a_100b_parameter_bert_compiles_for_a_4096_chip_v5p_slice():
    """Past the MLPerf sizes: `configs/bert_scale.py:100b` (hidden 12288, 64 scanned and
    rematerialised layers, FSDP over data=256, tensor and sequence parallelism 16) on
    v5p:16x16x16 fits the 95 GB per chip with no gather or scatter in the step."""
    from configs.bert_scale import get_config as scale_config

    config = scale_config("100b")
    assert ("residual_length", "model") in config.parallel.rules
    assert config.model.scan_unroll == 1 and config.model.remat
    report = inspect_config(config, topology="v5p:16x16x16", layer_estimate=False)
    assert report["devices"] == 4096 and report["mesh"] == {"data": 256, "model": 16}
    assert 1.1e11 < report["params"] < 1.2e11
    train = report["train"]
    assert "error" not in train, train.get("error")
    assert report["fits"]
    # FSDP: parameters and optimizer state are split over all 4096 chips.
    assert report["bytes_per_device"]["params"] < 1.2 * 4 * report["params"] / 4096
    assert train["gather_scatter"] == 0
    assert train["estimated_step_s"] > 0


@pytest.mark.slow  # ~1.5 min: BERT-large's step with two layers per scan iteration, twice
def test_cpu_only_forms_leave_the_tpu_program_alone(monkeypatch):
    """The dense layers' matmul (a custom_vjp for XLA:CPU's fast bf16 dots) and dropout's
    keep bits (four 16-bit words per threefry block) have forms for CPU only: a TPU
    lowering gets the program of the plain forms, written out here. Applied on every
    platform, the custom_vjp raised the compiler's estimate of this program from 12.13
    to 12.19 ms and the packed bits to 12.97 ms (on the 24-layer extrapolation, 2.4%
    and 18%; docs/performance.md "TPU step time"). JAX caches traced steps per process,
    so the caches are cleared between the two compiles."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    import mlperf.layers.dropout as dropout
    import mlperf.layers.linear as linear
    from mlperf.layers.matmul import MATMUL_OUTPUT

    def step_figures():
        config = get_config("mlperf_v07")
        # Two layers in the loop body the estimate sees, rematerialised: the program in
        # which both regressions were measured.
        config.model.update(scan_unroll=2, remat=True, remat_policy="dots_no_batch")
        config.train.global_batch_size = 32
        config.mesh.ici_shape = (8, 4)
        train = inspect_config(config, topology="v3:4x4", layer_estimate=False)["train"]
        assert "error" not in train, train.get("error")
        return train["compiler_step_s"], train["bytes_accessed_per_device"]

    ours = step_figures()
    jax.clear_caches()
    monkeypatch.setattr(
        linear, "matmul", lambda x, w: checkpoint_name(jnp.dot(x, w), MATMUL_OUTPUT)
    )
    # One 32-bit word per element, its high 16 bits: the other platforms' form.
    monkeypatch.setattr(dropout, "_words16", dropout._element_words16)
    plain = step_figures()
    jax.clear_caches()
    assert ours == plain

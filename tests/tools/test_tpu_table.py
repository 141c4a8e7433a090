"""`python -m launch.bench.tpu`'s table code on BERT tiny rows (v3:2x2, v4:2x2x1): each
row a real `launch.inspect` process, cached, summarised and rendered; a failed compile
keeps its error in its row and the table goes on."""

from __future__ import annotations

import json

import pytest

from launch.bench import tpu as bench_tpu
from launch.tables import tpu as tpu_table

pytestmark = pytest.mark.xdist_group("aot")


@pytest.mark.slow  # compiles tiny rows for two TPU generations (~30 s): make test-ci-slow
def test_tiny_rows_compile_cache_and_render(tmp_path):
    cache = str(tmp_path / "rows")
    rows = bench_tpu.run(["bert"], ["v3", "v4"], "tiny", cache, 600, compile_missing=True)
    assert [r["topology"] for r in rows] == ["v3:2x2", "v4:2x2x1"]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["chips"] == 4 and row["fits"] is True
        assert row["gather_scatter"] == 0
        assert row["step_s"] > 0 and 0 < row["mfu"] < 1
        assert row["time_to_train_s"] == pytest.approx(row["steps"] * row["step_s"])
        assert row["dollars"] > 0 and row["chip_hours"] > 0
        # The compiled FLOPs count the analytic matmuls plus elementwise work.
        assert 0.8 < row["flops_vs_analytic"] < 2.0, row
        # Every row brackets its step by the roofline with ICI hidden and after it.
        low, high = row["step_bounds_s"]
        assert 0 < low <= high
        if row["step_method"].startswith("roofline-eta"):  # step_model's fixed time on
            assert row["step_s"] > low  # top of the overlapped roofline at eta x peak
        elif row["step_method"].endswith("compiler estimate unusable"):
            assert row["step_s"] == pytest.approx(high)  # the no-overlap bound itself
    # v3:2x2 has 8 cores: the config's data=2 x model=4; v4 in megacore mode 4 devices:
    # the config's fixed mesh does not fit, so `data` takes what is left.
    assert rows[0]["mesh"] == "data=2,model=4" and rows[0]["note"] == ""
    assert rows[1]["mesh"] == "data=1,model=4" and "--mesh=data=-1,model=4" in rows[1]["note"]
    cached = json.loads((tmp_path / "rows" / "tiny-bert-v4.json").read_text())
    assert cached["rc"] == 0 and cached["report"]["device_kind"] == "TPU v4"
    # The model axis's 4 chips span two torus dimensions of v4:2x2x1: the ICI term counts
    # their collectives' bytes over both dimensions' links (parallel/ici_links.py).
    train = cached["report"]["train"]
    assert rows[1]["ici"] == "links spanned"
    assert 0 < train["ici_ring_bytes_per_device"] < train["wire_bytes_per_device"]
    # The cache answers without compiling; a row that is not cached is marked, not built.
    again = bench_tpu.run(["bert"], ["v3", "v4", "v6e"], "tiny", cache, 600, False)
    assert [r["step_s"] for r in again[:2]] == [r["step_s"] for r in rows]
    assert again[2]["error"] == "not compiled"
    # A compile that runs past its timeout keeps the error in its row; the table goes on.
    failed = bench_tpu.run(["bert"], ["v6e"], "tiny", cache, 0.01, True)
    assert failed[0]["error"].startswith("timed out after")
    text = tpu_table.markdown(rows + failed, bench_tpu.header(["bert"], ["v3"], "tiny", ""))
    lines = text.splitlines()
    assert lines[0].startswith("# TPU table") and "libtpu" in text
    assert "launch.bench.tpu --models bert" in text
    table = [ln for ln in lines if ln.startswith("| bert")]
    assert len(table) == 3 and "error: timed out" in table[2]
    for line in table[:2]:  # the compiler's steps show both bounds
        assert "ms with ICI overlapped, " in line and " ms serial)" in line
    assert all(ln.count("|") == len(tpu_table.COLUMNS) + 1 for ln in table)


def test_a_step_without_compiler_estimate_names_its_model_and_both_bounds():
    """v4 (step_model's roofline-eta) and a generation with no fitted model (the roofline
    plus ICI, which is its serial bound)."""
    method = tpu_table._method({}, "v4")
    assert method == "roofline-eta: compiler estimate unusable"
    row = {"step_s": 0.02, "step_method": method, "compiler_estimate": False}
    row.update(step_bounds_s=(0.01, 0.015), ici="links spanned")
    assert tpu_table._step_cell(row) == (
        "20.00 ms (roofline-eta: compiler estimate unusable; roofline 10.00 ms with ICI "
        "overlapped, 15.00 ms serial)"
    )
    row.update(step_s=0.015, step_method=tpu_table._method({}, "v5e"))
    assert tpu_table._step_cell(row) == (
        "15.00 ms (roofline + ICI: compiler estimate unusable; 10.00 ms with ICI overlapped)"
    )
    # A row compiled before the ICI term counted the torus dimensions says so.
    del row["ici"]
    assert tpu_table._step_cell(row) == (
        "15.00 ms (roofline + ICI: compiler estimate unusable; 10.00 ms with ICI overlapped; "
        "ICI: each collective on one ring)"
    )

"""launch.tpu_table: docs/tpu-table.md and the README's TPU rows are functions of the rows
file in the repository (compared byte for byte), and a compile joins the rows only with
the clean commit it ran at."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.tables import tpu_page

ROOT = Path(__file__).resolve().parents[2]  # the repository (tests/<kind>/this file)


@pytest.fixture(scope="module")
def rows():
    return tpu_page.load_rows()


def test_the_page_is_generated_from_the_rows_file(rows):
    assert tpu_page.PAGE.read_text() == tpu_page.page(rows)


def test_the_readme_quotes_the_rows_by_generation(rows):
    readme = tpu_page.README.read_text()
    assert readme.count(tpu_page.README_START) == 1 and readme.count(tpu_page.README_END) == 1
    assert tpu_page.readme_text(readme, rows) == readme
    block = readme[readme.index(tpu_page.README_START) : readme.index(tpu_page.README_END)]
    # Each quoted v3 row names the commit its compile ran at, as the rows file does.
    for row in rows:
        if row["generation"] == "v3":
            assert f"{row['date']}, `{row['commit']}`" in block


def test_every_row_names_its_compile(rows):
    assert len(rows) == len({r["key"] for r in rows})
    for row in rows:
        assert row["commit"] and row["date"] and row["libtpu"] and row["jax"], row["key"]
        assert row["tree_clean"] is True or row.get("recovered"), row["key"]


def test_the_page_header_comes_from_the_rows(rows):
    changed = copy.deepcopy(rows)
    changed[0]["commit"], changed[0]["tree_clean"] = "0123456789", True
    changed[0].pop("recovered")
    text = tpu_page.page(changed)
    assert "at commit `0123456789`: BERT on v3." in text
    assert "The rows of " in text and "Every row was" not in text
    assert text != tpu_page.page(rows)


def test_add_cached_refuses_a_compile_without_a_clean_commit(rows):
    spec = {"model": "bert", "variant": "mlperf_v07", "generation": "v3"}
    with pytest.raises(tpu_page.TpuTableError, match="records no commit"):
        tpu_page.add_cached(rows, [{"spec": spec}])
    dirty = {"spec": spec, "commit": "0123456789", "tree_clean": False}
    with pytest.raises(tpu_page.TpuTableError, match="uncommitted changes"):
        tpu_page.add_cached(rows, [dirty])


def test_add_cached_replaces_the_row_of_its_key(rows, monkeypatch):
    # summarise needs a compiled report; here it stands in with a fixed row.
    new = {**rows[0], "commit": "0123456789", "tree_clean": True, "step_s": 0.04}
    new.pop("recovered")
    monkeypatch.setattr(tpu_page.tpu, "summarise", lambda result: new)
    clean = {"spec": {}, "commit": "0123456789", "tree_clean": True}
    updated = tpu_page.add_cached(rows, [clean])
    assert len(updated) == len(rows) and updated[0] == new and updated[1:] == rows[1:]


def test_cli_check_and_rewrite(rows, tmp_path):
    rows_file, page, readme = tmp_path / "rows.json", tmp_path / "page.md", tmp_path / "README.md"
    tpu_page.save_rows(rows[:2], rows_file)
    assert tpu_page.load_rows(rows_file) == rows[:2]  # the file reads back as written
    page.write_text("stale\n")
    readme.write_text(f"# x\n{tpu_page.README_START}\nold\n{tpu_page.README_END}\nend\n")
    cmd = [sys.executable, "-m", "launch.tpu_table", f"--rows={rows_file}"]
    cmd += [f"--page={page}", f"--readme={readme}"]
    out = subprocess.run(cmd + ["--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip().startswith("tpu_table: ")
    assert "differ from what" in out.stderr and page.read_text() == "stale\n"
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    assert page.read_text() == tpu_page.page(rows[:2])
    assert readme.read_text().endswith(f"{tpu_page.README_END}\nend\n")
    subprocess.run(cmd + ["--check"], cwd=ROOT, capture_output=True, text=True, check=True)
    rows_file.write_text(json.dumps({"no rows": []}))
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "not a readable TPU-table rows file" in out.stderr


def test_rows_without_a_measured_run_print_the_planners_cells(rows):
    """A generation with no measured run (v5p, v5e, v6e) prints no step, MFU, time to
    train, chip-hours or price: the planner's cells for such a row (`search.table`)."""
    from mlperf.planning import search, step_model

    planner_row = {
        "candidate": "v5e:4x4 model=1", "topology": "v5e:4x4", "memory_per_device": 1 << 30,
        "fits": True, "step_s": 0.0123, "compute_s": 0.01, "memory_s": 0.004, "comm_s": 0.003,
        "dcn_s": 0.0, "compiler_s": None, "mfu": 0.4, "time_to_train_s": 60.0,
        "chip_hours": 0.3, "cost_usd": 0.4, "scaling_efficiency": 1.0,
        "step_model": step_model.validation_label("v5e"), "validated": False,
    }  # fmt: skip
    planner = search.table([planner_row]).splitlines()[-1].split(" | ")
    # step, MFU, time to train, chip-hours, price
    expected = [planner[i] for i in (4, 10, 11, 12, 13)]
    assert expected == ["not validated", "-", "not validated", "-", "-"]
    lines = tpu_page.page(rows).splitlines()
    unvalidated = [r for r in rows if r["generation"] not in step_model.VALIDATED]
    assert {r["generation"] for r in unvalidated} == {"v5p", "v5e", "v6e"}
    for row in unvalidated:
        line = next(ln for ln in lines if ln.startswith(f"| {row['model']} | {row['topology']} "))
        cells = line.split(" | ")
        assert [cells[i] for i in (9, 10, 12, 13, 14)] == expected, row["key"]
        assert f"{row['step_s'] * 1e3:.2f} ms" not in line and "$" not in line


def test_stale_rows_are_refused_until_restepped(rows, tmp_path):
    """A v4 row holding the plain roofline + ICI step (an earlier model's) writes no page;
    `--restep` recomputes it from its figures and notes that in the row."""
    rows_file, page = tmp_path / "rows.json", tmp_path / "page.md"
    v4 = next(r for r in rows if r["key"] == "mlperf_v07-bert-v4")
    stale = {k: v for k, v in v4.items() if k != "restepped"}
    stale.update(step_s=0.06261, step_method="roofline + ICI: compiler estimate unusable")
    tpu_page.save_rows([rows[0], stale], rows_file)
    cmd = [sys.executable, "-m", "launch.tpu_table", f"--rows={rows_file}", f"--page={page}"]
    cmd += ["--readme="]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "mlperf_v07-bert-v4" in out.stderr
    assert "--restep" in out.stderr and not page.exists()
    subprocess.run(cmd + ["--restep"], cwd=ROOT, capture_output=True, text=True, check=True)
    restepped = tpu_page.load_rows(rows_file)[1]
    assert restepped["step_s"] == pytest.approx(v4["step_s"]) and restepped["restepped"]
    assert restepped["commit"] == v4["commit"] and restepped["date"] == v4["date"]
    assert "44.05 ms (roofline-eta" in page.read_text()

"""docs/tpu-table.md and the README's TPU rows, written from the rows kept in the repository.

The rows file (docs/results/tpu-table-rows.json) holds one summarised row per compile
(`launch.tables.tpu.summarise`), each with the date, commit, libtpu and jax of its
compile. The page, header included, and the README's block of v3 rows are functions of
that file alone, so a test regenerates both and compares them byte for byte. Compiled
rows join the file only from a clean commit. A stored row whose step an earlier step
model computed is stale: no page is written from it until `--restep` recomputes its step
from its stored figures (`restep`, recording that in the row). No jax: it runs in a
second (adding rows summarises them, which imports the configs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launch.tables import tpu, tpu_step
from launch.tables.results import ResultsTableError, replace_between_markers
from mlperf.planning import step_model

ROOT = Path(__file__).resolve().parents[2]
ROWS_FILE = ROOT / "docs" / "results" / "tpu-table-rows.json"
PAGE = ROOT / "docs" / "tpu-table.md"
README = ROOT / "README.md"
README_START = "<!-- tpu-table:start (written by `python -m launch.tpu_table`; do not edit) -->"
README_END = "<!-- tpu-table:end -->"
COMMAND = "python -m launch.tpu_table"
# The command line that compiles rows into a cache for `--add_rows`.
COMPILE = (
    "python -m launch.bench.tpu --models bert,transformer,ssd,maskrcnn "
    "--generations v3,v4,v5p,v5e,v6e --cache_dir /tmp/multipod-tpu-table"
)
_NAMES = {"bert": "BERT", "transformer": "Transformer", "ssd": "SSD", "maskrcnn": "Mask R-CNN"}


class TpuTableError(ValueError):
    """A row that cannot join the table, or a rows file that does not read."""


def load_rows(path: str | os.PathLike = ROWS_FILE) -> list[dict[str, Any]]:
    """The rows of the rows file, in table order."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
    except (OSError, ValueError, KeyError) as e:
        raise TpuTableError(f"{path}: not a readable TPU-table rows file ({e}).") from e
    return sorted(rows, key=_order)


def save_rows(rows: Sequence[dict[str, Any]], path: str | os.PathLike = ROWS_FILE) -> None:
    """Writes the rows file: table order, a row a line (each dict in its own order, which
    is the order of the cells' collectives)."""
    lines = ",\n".join(f"  {json.dumps(row)}" for row in sorted(rows, key=_order))
    Path(path).write_text(f'{{"rows": [\n{lines}\n]}}\n')


def _order(row: dict[str, Any]) -> tuple:
    model, generation = row["model"], row["generation"]
    rank = tpu.MODELS.index(model) if model in tpu.MODELS else len(tpu.MODELS)
    return rank, model, tpu.GENERATIONS.index(generation), row["variant"]


def add_cached(rows: Sequence[dict[str, Any]], results: Sequence[dict]) -> list[dict]:
    """`rows` with the compiles in `results` (cached `run_row` results) summarised into
    them, each replacing the row of its key. A result with no recorded commit or from a
    tree with uncommitted changes is refused: its numbers would name no code."""
    by_key = {row["key"]: row for row in rows}
    for result in results:
        spec = result.get("spec", {})
        name = f"{spec.get('variant')}-{spec.get('model')}-{spec.get('generation')}"
        if "commit" not in result:
            raise TpuTableError(
                f"{name}: the cached compile records no commit; recompile it with "
                "`python -m launch.bench.tpu`."
            )
        if result.get("tree_clean") is not True:
            raise TpuTableError(
                f"{name}: compiled at {result['commit']} from a tree with uncommitted "
                "changes (or an unknown one); commit and recompile it."
            )
        row = tpu.summarise(result)
        by_key[row["key"]] = row
    return sorted(by_key.values(), key=_order)


RESTEP = f"{COMMAND} --restep"


def restep(rows: Sequence[dict[str, Any]], date: str) -> list[dict[str, Any]]:
    """`rows` with each stale row's step (`tpu_step.stale`: an earlier step model's)
    recomputed from its stored figures by `tpu_step.restep_row`, the code a compile takes
    its step with. The row keeps its compile's provenance and gains `restepped`: when, by
    which model, and that it was not recompiled."""
    out = []
    for row in rows:
        if _stale(row):
            row = tpu_step.restep_row(row)
            row["restepped"] = (
                f"{date}: step, MFU, time to train, chip-hours and price recomputed from the "
                f"row's stored figures by {_model(row['generation'])} (`{RESTEP}`), "
                "not recompiled"
            )
        out.append(row)
    return sorted(out, key=_order)


def _model(generation: str) -> str:
    """`roofline-eta (6.6 ms + ...)`: the model a row without a compiler estimate takes."""
    p = step_model.ROOFLINE_ETA.get(generation)
    if p is None:
        return "the roofline plus ICI"
    return (
        f"roofline-eta ({p.fixed_s * 1e3:.1f} ms + max(FLOPs at eta={p.eta:.2f} x peak, "
        "HBM, ICI), then DCN)"
    )


def _stale(row: dict[str, Any]) -> bool:
    try:
        return tpu_step.stale(row)
    except ValueError as e:
        raise TpuTableError(f"{e} (a stored row's step is recomputed from them).") from e


def stale_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The keys of the rows whose step an earlier step model computed."""
    return [row["key"] for row in rows if _stale(row)]


def _rows_text(rows: Sequence[dict[str, Any]]) -> str:
    """`BERT on v3 and v4, SSD on v5e`: the models and generations of `rows`."""
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        generations = [r["generation"] for r in rows if r["model"] == model]
        listed = ", ".join(generations[:-1]) + " and " if len(generations) > 1 else ""
        parts.append(f"{_NAMES.get(model, model)} on {listed}{generations[-1]}")
    return ", ".join(parts)


def _same(rows: Sequence[dict[str, Any]], key: str) -> str | None:
    values = {str(r.get(key)) for r in rows}
    return values.pop() if len(values) == 1 else None


def provenance(rows: Sequence[dict[str, Any]]) -> str:
    """What compiled the rows: each commit and date with its rows, the compiler, the
    machine, and for rows read back from an earlier page, that."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["date"], row["commit"]), []).append(row)
    lines = []
    for (date, commit), members in sorted(groups.items(), reverse=True):
        clean = "" if all(r.get("tree_clean") for r in members) else " (tree state not recorded)"
        lines.append(f"Compiled on {date} at commit `{commit}`{clean}: {_rows_text(members)}.")
    compiler = [
        f"{key} {_same(rows, key)}" for key in ("libtpu", "jax") if _same(rows, key) is not None
    ]
    machine = _same(rows, "machine")
    text = " ".join(lines)
    if compiler:
        text += f" Compiler: {', '.join(compiler)}."
    if machine:
        text += f" Machine: {machine}, each compile alone on it."
    recovered = [r for r in rows if r.get("recovered")]
    if recovered:
        which = (
            "Every row was"
            if len(recovered) == len(rows)
            else (f"The rows of {_rows_text(recovered)} were")
        )
        text += f" {which} {_same(recovered, 'recovered') or 'read back from an earlier page'}."
    restepped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("restepped"):
            restepped.setdefault(row["restepped"].split(":", 1)[0], []).append(row)
    for date, members in sorted(restepped.items(), reverse=True):
        text += (
            f" The steps of {_rows_text(members)} (with MFU, time to train, chip-hours and "
            f"price) were recomputed on {date} from the rows' stored figures by the current "
            f"step model, not recompiled (`{RESTEP}`)."
        )
    return text


def page(rows: Sequence[dict[str, Any]]) -> str:
    """docs/tpu-table.md: title, column notes, the rows' provenance, the commands that
    compile rows and rewrite the page, then the table."""
    header = (
        f"Written by `{COMMAND}` from [results/tpu-table-rows.json](results/tpu-table-rows.json)"
        f" (do not edit). {provenance(rows)} Compile rows (minutes and more than 10 GB of "
        "memory each) and keep them, rewriting this page and the README's v3 rows, with\n\n"
        f"```\n{COMPILE}\n{COMMAND} --add_rows /tmp/multipod-tpu-table\n```"
    )
    return tpu.markdown(list(rows), header)


def readme_block(rows: Sequence[dict[str, Any]]) -> str:
    """The README's quote of the table: each model's v3 row (Google's v0.7 scale) with
    its estimated step, time to train, Google's published figures and its compile."""
    v3 = [r for r in rows if r["generation"] == "v3" and "step_s" in r]
    lines = [
        f"The v3 rows of [docs/tpu-table.md](docs/tpu-table.md) ({provenance_short(v3)}):",
        "",
        "| model | topology (chips) | estimated step | time to train | Google v0.7 "
        "(measured) | compiled |",
        "|---|---|---|---|---|---|",
    ]
    for row in v3:
        published = row["published"] or "-"
        if row.get("vs_published"):
            published += f"; est./published {row['vs_published']:.2f}"
        lines.append(
            f"| {_NAMES.get(row['model'], row['model'])} | {row['topology']} ({row['chips']}) "
            f"| {row['step_s'] * 1e3:.2f} ms | {row['steps']} steps, "
            f"{tpu._time(row['time_to_train_s'])} | {published} | "
            f"{row['date']}, `{row['commit']}` |"
        )
    return "\n".join(lines)


def provenance_short(rows: Sequence[dict[str, Any]]) -> str:
    """`libtpu 0.0.42.1, jax 0.10.2` where the rows agree on them."""
    parts = [f"{k} {_same(rows, k)}" for k in ("libtpu", "jax") if _same(rows, k) is not None]
    return ", ".join(parts) or "compilers as in the page"


def readme_text(readme: str, rows: Sequence[dict[str, Any]]) -> str:
    """`readme` with its TPU-table block rewritten from `rows`."""
    try:
        return replace_between_markers(readme, readme_block(rows), README_START, README_END)
    except ResultsTableError as e:
        raise TpuTableError(str(e)) from e

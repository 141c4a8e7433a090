"""Write docs/tpu-table.md and the README's TPU rows from the rows kept in the repository.

    python -m launch.tpu_table [--add_rows /tmp/multipod-tpu-table] [--restep] [--check]
        [--rows docs/results/tpu-table-rows.json] [--page docs/tpu-table.md] [--readme README.md]

The rows file holds one summarised compile per row with its date, commit, libtpu and jax
(`python -m launch.bench.tpu` compiles rows into its cache). --add_rows summarises the
cached compiles of those folders into the rows file (each replacing the row of its key;
a compile from a tree with uncommitted changes is refused); then the page and the
README's block are rewritten from the rows file alone. A row whose step an earlier step
model computed (the step model changed since its compile) is stale, and nothing is
written while one is: --restep recomputes those rows' step, MFU, time to train,
chip-hours and price from their stored figures with the code a compile uses
(launch/tables/tpu_step.py), each row noting it under `restepped` (today's date) and
keeping its compile's date and commit. --check writes nothing and fails when either page
differs from what the rows make or a row is stale.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from absl import app, flags

from launch.tables import tpu_page

_ROWS = flags.DEFINE_string("rows", str(tpu_page.ROWS_FILE), "The rows file (JSON).")
_PAGE = flags.DEFINE_string("page", str(tpu_page.PAGE), "The page to write.")
_README = flags.DEFINE_string(
    "readme", str(tpu_page.README), "Markdown file with the tpu-table markers ('' for none)."
)
_ADD_ROWS = flags.DEFINE_list(
    "add_rows", [], "Cache folders of `launch.bench.tpu` whose compiles join the rows file."
)
_RESTEP = flags.DEFINE_bool(
    "restep", False, "Recompute stale rows' steps from their stored figures (no compile)."
)
_CHECK = flags.DEFINE_bool("check", False, "Write nothing; fail if the page or README is stale.")


def _cached(folders: list[str]) -> list[dict]:
    results = []
    for folder in folders:
        files = sorted(Path(folder).glob("*.json"))
        if not files:
            raise tpu_page.TpuTableError(f"{folder}: no cached compiles (*.json) there.")
        for file in files:
            try:
                results.append(json.loads(file.read_text()))
            except (OSError, ValueError) as e:
                raise tpu_page.TpuTableError(f"{file}: not a cached compile ({e}).") from e
    return results


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        rows = tpu_page.load_rows(_ROWS.value)
        if _ADD_ROWS.value and not _CHECK.value:
            rows = tpu_page.add_cached(rows, _cached(_ADD_ROWS.value))
            tpu_page.save_rows(rows, _ROWS.value)
        if _RESTEP.value and not _CHECK.value:
            rows = tpu_page.restep(rows, time.strftime("%Y-%m-%d", time.gmtime()))
            tpu_page.save_rows(rows, _ROWS.value)
        earlier = tpu_page.stale_keys(rows)
        if earlier:
            sys.exit(
                f"tpu_table: {', '.join(earlier)} in {_ROWS.value} hold the step of an earlier "
                f"step model; run `{tpu_page.RESTEP}` to recompute them from their figures."
            )
        outputs = {_PAGE.value: tpu_page.page(rows)}
        if _README.value:
            readme = Path(_README.value).read_text()
            outputs[_README.value] = tpu_page.readme_text(readme, rows)
        if _CHECK.value:
            stale = [p for p, text in outputs.items() if Path(p).read_text() != text]
            if stale:
                sys.exit(
                    f"tpu_table: {', '.join(stale)} differ from what {_ROWS.value} makes; "
                    "run `python -m launch.tpu_table` to rewrite them."
                )
            print(f"tpu_table: {', '.join(outputs)} match {len(rows)} rows")
            return
    except (tpu_page.TpuTableError, OSError) as e:
        sys.exit(f"tpu_table: {e}")
    for path, text in outputs.items():
        Path(path).write_text(text)
    print(f"tpu_table: {len(rows)} rows written into {', '.join(outputs)}")


if __name__ == "__main__":
    app.run(main)

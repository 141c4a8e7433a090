"""`python -m launch.bench tpu`: the TPU table of `mlperf_v07` compiles (mlperf/tpu_table.py).

    python -m launch.bench tpu [--models bert,transformer,ssd,maskrcnn]
        [--generations v3,v4,v5p,v5e,v6e] [--variant mlperf_v07] [--out docs/tpu-table.md]
        [--cache_dir /tmp/multipod-tpu-table] [--timeout_s 900] [--nocompile]

Each row is one `launch.inspect --json` process with a timeout; its result is cached in
--cache_dir (keyed by the command), so rows can be compiled one invocation at a time and
the table assembled from them (--nocompile: cached rows only, the rest marked).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mlperf import tpu_table


def header(models: list[str], generations: list[str], variant: str, out: str) -> str:
    """Date, commit, libtpu and jax versions, machine and the regenerating command."""
    import importlib.metadata as md

    root = Path(tpu_table.__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = "unknown"
    versions = {}
    for package in ("libtpu", "jax"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = "not installed"
    command = (
        f"python -m launch.bench tpu --models {','.join(models)} "
        f"--generations {','.join(generations)}"
        + (f" --variant {variant}" if variant != "mlperf_v07" else "")
        + (f" --out {out}" if out else "")
    )
    return (
        f"Generated {time.strftime('%Y-%m-%d', time.gmtime())}, commit {commit}, libtpu "
        f"{versions['libtpu']} compiler estimate (jax {versions['jax']}), 2-core CPU "
        "container; rows not compiled by this command come from its cache. Regenerate with\n\n"
        f"```\n{command}\n```"
    )


def run(
    models: list[str],
    generations: list[str],
    variant: str,
    cache_dir: str,
    timeout_s: float,
    compile_missing: bool,
) -> list[dict]:
    """Every row (model-major), compiled or read from the cache, summarised."""
    rows = []
    for model in models:
        for generation in generations:
            spec = tpu_table.row_spec(model, generation, variant)
            print(f"[tpu table] {spec.key}: {' '.join(spec.command('python'))}", file=sys.stderr)
            result = tpu_table.run_row(spec, cache_dir, timeout_s, compile_missing)
            rows.append(tpu_table.summarise(result))
    return rows


def main(
    models: list[str],
    generations: list[str],
    variant: str,
    out: str,
    cache_dir: str,
    timeout_s: float,
    compile_missing: bool,
) -> None:
    """Runs the rows and prints (and with `out`, writes) the markdown table."""
    bad = [m for m in models if m not in tpu_table.MODELS]
    bad += [g for g in generations if g not in tpu_table.GENERATIONS]
    if bad:
        print(
            f"multipod: error: unknown {', '.join(bad)}; models: {', '.join(tpu_table.MODELS)}; "
            f"generations: {', '.join(tpu_table.GENERATIONS)}.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    rows = run(models, generations, variant, cache_dir, timeout_s, compile_missing)
    text = tpu_table.markdown(rows, header(models, generations, variant, out))
    print(text)
    if out:
        Path(out).write_text(text)

"""`python -m launch.bench.tpu`: the TPU table of `mlperf_v07` compiles (launch/tables/tpu.py).

    python -m launch.bench.tpu [--models bert,transformer,ssd,maskrcnn]
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

from absl import flags

from launch.bench.common import run as run_tool
from launch.tables import tpu as tpu_table

_MODELS = flags.DEFINE_list("models", ["bert", "transformer", "ssd", "maskrcnn"], "mlperf configs.")
_GENERATIONS = flags.DEFINE_list(
    "generations", ["v3", "v4", "v5p", "v5e", "v6e"], "TPU generations."
)
_VARIANT = flags.DEFINE_string(
    "variant", "mlperf_v07", "Config variant (others compile on 2x2 slices)."
)
_OUT = flags.DEFINE_string("out", "", "Also write the markdown table here.")
_CACHE = flags.DEFINE_string("cache_dir", "/tmp/multipod-tpu-table", "One JSON per compiled row.")
_TIMEOUT = flags.DEFINE_float("timeout_s", 900.0, "Seconds per row's compile.")
_COMPILE = flags.DEFINE_bool("compile", True, "Compile rows not in the cache.")


def header(models: list[str], generations: list[str], variant: str, out: str) -> str:
    """Date, commit, libtpu and jax versions, machine and the regenerating command."""
    import importlib.metadata as md

    root = Path(__file__).resolve().parents[2]  # the repository root
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
        f"python -m launch.bench.tpu --models {','.join(models)} "
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


def write_table(
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


def main(argv: list[str]) -> None:
    write_table(
        _MODELS.value,
        _GENERATIONS.value,
        _VARIANT.value,
        _OUT.value,
        _CACHE.value,
        _TIMEOUT.value,
        _COMPILE.value,
    )


if __name__ == "__main__":
    run_tool(main)

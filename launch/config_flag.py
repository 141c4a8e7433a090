"""The `--config` flag, defined once for every tool that takes a config file.

absl refuses a flag name that two imported modules define, and a test process (or a
program) may import several tools: `launch.train`, the `launch.bench` wing,
`launch.final_bleu`, `launch.bench.packing_stats`. A tool that must not change the
config's keys locks it after reading (`launch.train` does)."""

from __future__ import annotations

from ml_collections import config_flags

CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=False
)

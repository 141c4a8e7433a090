"""The tiny BERT run the whole-run checkpoint tests share (tests/system/test_checkpoint.py,
tests/system/test_resume_safety_runs.py): 12 steps of a 1-layer model, a checkpoint every 2
steps, all kept, a target it never reaches (every run trains all its steps)."""

from __future__ import annotations

from configs.bert import get_config

STEPS = 12
EVERY = 2  # steps between checkpoints
SETTINGS = {
    "train.steps": STEPS,
    "train.log_every_steps": 1,
    "train.eval_every_samples": 64 * 4,
    "train.target": 2.0,  # unreachable: every run trains all its steps
    "train.stop_at_target": False,
    "model.num_layers": 1,
    "model.hidden_size": 32,
    "model.num_heads": 4,
    "model.mlp_dim": 64,
    "checkpoint.every_steps": EVERY,
    "checkpoint.keep": 100,
}
# The same settings as `python -m launch.train` flags (runs in a subprocess).
OVERRIDES = [f"--config.{k}={v}" for k, v in SETTINGS.items()]


def tiny_config(**extra):
    """The tiny config with SETTINGS, then `extra` (dotted keys) applied."""
    c = get_config("tiny")
    for key, value in {**SETTINGS, **extra}.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c

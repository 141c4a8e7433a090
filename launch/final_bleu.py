"""Final BLEU of a finished Transformer run on whole eval sets (`eval.final_sets`).

    python -m launch.final_bleu --config configs/transformer.py:multi30k \\
        --workdir W --config.data.data_dir=DIR [--sets val,test]

restores the newest checkpoint in W (the run's last step: the loop checkpoints at every
eval and the last step is an eval), writes W/final_bleu.json, appends one
{"kind": "final_eval"} line per set to W/metrics.jsonl and adds "final_eval" to
W/result.json (mlperf/transformer/final_bleu.py).
"""

from __future__ import annotations

from absl import app, flags

from launch.config_flag import CONFIG

_WORKDIR = flags.DEFINE_string("workdir", None, "The finished run's work directory.")
_SETS = flags.DEFINE_string("sets", "", "Comma-separated names of eval.final_sets ('' = all).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from input_pipeline.input_errors import InputError
    from input_pipeline.subword_vocab import VocabFileError
    from mlperf.checkpoint import CheckpointConfig, Checkpointer
    from mlperf.trainer import build_trainer
    from mlperf.transformer.final_bleu import evaluate_sets, record
    from mlperf.validate import ConfigError, check_data_dir

    config, workdir = CONFIG.value, _WORKDIR.value
    if config is None or not workdir:
        raise app.UsageError("--config and --workdir are required.")
    try:
        check_data_dir(config)  # the eval sets are files under data.data_dir
    except ConfigError as e:
        raise SystemExit(f"final_bleu: {e}") from None
    # The layout only: the model's vocabulary size is the config's, rounded up as in training.
    trainer = build_trainer(config, prepare_data=False)
    checkpointer = Checkpointer(
        CheckpointConfig.from_config(config, workdir), trainer.task.target_metric, read_only=True
    )
    restored = checkpointer.restore_latest(trainer.layout.abstract_train_state)
    if restored is None:
        raise SystemExit(f"no checkpoint under {workdir}: train first (launch.train).")
    names = [n for n in _SETS.value.split(",") if n] or list(config.eval.final_sets)
    for name in names:  # recorded one by one: a long second set does not hold up the first
        # An unknown set name, or a missing or malformed eval or vocabulary file: one line.
        try:
            results = evaluate_sets(
                trainer.task, restored.state["params"], trainer.layout, trainer.partitioner, [name]
            )
        except (ConfigError, InputError, VocabFileError, FileNotFoundError) as e:
            raise SystemExit(f"final_bleu: {e}") from None
        record(workdir, restored.step, results)


if __name__ == "__main__":
    app.run(main)

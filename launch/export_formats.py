"""The work behind `python -m launch.export` (launch/export.py): one checkpoint restored
and written in each format, callable without the command line (`export(...)`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

FORMATS = ("safetensors", "torch", "stablehlo")


def output_name(fmt: str, benchmark: str) -> str:
    """hf for the Hugging Face BERT (W/hf_step<N>), the format's name otherwise."""
    return "hf" if fmt == "safetensors" or (benchmark == "bert" and fmt == "torch") else fmt


def export(
    workdir: str,
    fmt: str = "safetensors",
    output: str = "",
    step: int = -1,
    checkpoint_dir: str = "",
    platforms: Sequence[str] = ("cpu",),
    batch_size: int = 8,
    input_length: int = 0,
    trained=None,
) -> list[str]:
    """Restores one checkpoint (or takes `trained`, a TrainedModel restored already) and
    writes it in `fmt`; returns the paths written."""
    from mlperf.stablehlo_export import check_platforms
    from mlperf.trained_model import default_output, load_trained, read_run

    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    run = trained.run if trained is not None else read_run(workdir, step, checkpoint_dir)
    if fmt == "safetensors" and run.benchmark != "bert":
        raise ValueError(
            f"--format safetensors writes BERT for Hugging Face; this run is {run.benchmark!r}: "
            "use --format torch or --format stablehlo"
        )
    if fmt == "stablehlo":
        platforms = check_platforms(platforms)
        if batch_size < 1:
            raise ValueError(f"--batch_size {batch_size}: give at least 1")
    vocab_file = _bert_vocab(run.config) if run.benchmark == "bert" else None
    if trained is None:
        trained = load_trained(run, vocab_size=_bert_vocab_size(run.config, vocab_file))
    output = output or default_output(workdir, output_name(fmt, run.benchmark), run.step)
    if fmt == "stablehlo":
        return _stablehlo(trained, output, platforms, batch_size, input_length, vocab_file)
    return _torch(trained, output)


def _torch(trained, output: str) -> list[str]:
    """The weights for PyTorch: Hugging Face BERT, the Transformer peer's state_dict, or the
    detectors' torchvision backbone and heads."""
    params, benchmark = trained.host_params(), trained.run.benchmark
    if benchmark == "bert":
        from mlperf.bert.hf_export import export_safetensors

        return export_safetensors(params, trained.task.model_config(), output)
    if benchmark == "transformer":
        from mlperf.torch_save import save_state_dict
        from mlperf.transformer.torch_export import peer_config, to_torch_state_dict

        cfg = trained.task.model_config()
        weights = save_state_dict(
            to_torch_state_dict(params, cfg.num_layers), os.path.join(output, "transformer.pt")
        )
        config_path = os.path.join(output, "config.json")
        with open(config_path, "w") as f:
            json.dump(peer_config(cfg), f, indent=2)
        return [weights, config_path]
    from mlperf.detection_export import export_detector

    return export_detector(params, _backbone_config(trained), output)


def _backbone_config(trained):
    if trained.run.benchmark == "ssd":
        from mlperf.ssd.model import backbone_config

        return backbone_config(trained.task.model_config())
    return trained.task.backbone_config()


def _stablehlo(
    trained, output, platforms, batch_size: int, input_length: int, vocab_file: str | None
) -> list[str]:
    from input_pipeline import storage
    from mlperf import inference_programs
    from mlperf.detection_predict import num_classes, run_label_map
    from mlperf.stablehlo_export import export_program

    benchmark = trained.run.benchmark
    if benchmark == "bert":
        program = inference_programs.bert_program(trained, batch_size, vocab_file)
    elif benchmark == "transformer":
        from mlperf.transformer.predict import Translator

        translator = Translator(trained, _translation_vocab(trained))
        length = input_length or int(trained.config.data.eval_max_length)
        program = inference_programs.transformer_program(translator, batch_size, length)
    else:
        labels, _ = run_label_map(trained.task, num_classes(trained))
        make = getattr(inference_programs, f"{benchmark}_program")
        program = make(trained, batch_size, labels)
    source = {
        "workdir": storage.parent(trained.run.directory),
        "benchmark": benchmark,
        "variant": trained.config.get("variant", ""),
        "step": trained.run.step,
    }
    return export_program(program, trained.host_params(), output, platforms, source)


def _bert_vocab(config) -> str | None:
    """The run's vocab.txt (its size tells the table's padding rows; stablehlo ships it
    beside the program), if it can be found."""
    from mlperf.bert.predict import run_vocab_file

    try:
        return run_vocab_file(config)
    except (FileNotFoundError, ValueError) as e:
        print(f"multipod: warning: the run's vocabulary is not here: {e}", file=sys.stderr)
        return None


def _bert_vocab_size(config, vocab_file: str | None) -> int:
    from mlperf.bert.predict import vocab_size_of

    return vocab_size_of(vocab_file, bool(config.data.lowercase)) if vocab_file else 0


def _translation_vocab(trained):
    from mlperf.transformer.predict import run_vocabulary

    try:
        return run_vocabulary(trained.config)
    except (FileNotFoundError, ValueError) as e:
        print(f"multipod: warning: no vocabulary beside the program: {e}", file=sys.stderr)
        return None

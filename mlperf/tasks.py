"""Benchmark name -> Task class. Adding a model adds one line here."""

from __future__ import annotations

from input_pipeline.input_errors import InputError
from mlperf.task import Task


def get_task(config) -> Task:
    """The Task for `config.benchmark`."""
    name = config.benchmark
    if name == "bert":
        from mlperf.bert.task import BertTask

        return BertTask(config)
    if name == "transformer":
        from mlperf.transformer.task import TransformerTask

        return TransformerTask(config)
    if name == "ssd":
        from mlperf.ssd.task import SsdTask

        return SsdTask(config)
    if name == "maskrcnn":
        from mlperf.maskrcnn.task import MaskRcnnTask

        return MaskRcnnTask(config)
    raise InputError(
        f"benchmark {name!r} is not implemented; available: bert, transformer, ssd, maskrcnn."
    )

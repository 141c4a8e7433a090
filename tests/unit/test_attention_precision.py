"""Attention scores and softmax in bfloat16 (`model.attention_softmax_dtype`)."""

from __future__ import annotations

import pytest

from configs.bert import get_config
from mlperf.validate import ConfigError, validate


def test_an_unknown_softmax_dtype_is_one_clear_error():
    config = get_config("tiny")
    config.model.attention_softmax_dtype = "float16"
    with pytest.raises(ConfigError, match="attention_softmax_dtype='float16'"):
        validate(config, 8)

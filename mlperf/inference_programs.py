"""The inference program each benchmark exports (`launch.export --format stablehlo`): a
pure function of (params, named inputs) built from the task's own eval code, its static
input shapes, and the files a user needs beside it (vocabulary, class names).

    bert         input_ids, segment_ids, input_mask [B, S]; masked_lm_positions [B, P]
                 -> mlm_logits [B, P, V], nsp_logits [B, 2]
    transformer  inputs [B, L] (source ids, EOS-terminated, 0-padded)
                 -> tokens [B, L + max_extra_length] (beam search, as the evaluator)
    ssd          image [B, S, S, 3] (normalised) -> boxes [B, D, 4] (x0, y0, x1, y1 in
                 [0, 1]), scores [B, D], classes [B, D], valid [B] (NMS on device)
    maskrcnn     image [B, S, S, 3] (resized, padded, normalised) -> boxes [B, D, 4]
                 (y1, x1, y2, x2 in input pixels), scores, classes, valid [B, D],
                 masks [B, D, M, M] (probabilities inside each box)
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp

from mlperf.stablehlo_export import Program

IMAGENET_NORMALISATION = (
    "RGB / 255, minus the ImageNet mean (0.485, 0.456, 0.406), divided by its standard "
    "deviation (0.229, 0.224, 0.225)"
)


def _struct(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def bert_program(trained, batch_size: int, vocab_file: str | None) -> Program:
    """Both pretraining heads at the masked positions (the model's __call__)."""
    layout = trained.layout
    last = trained.task.phases()[-1].data
    S, P, B = int(last["seq_length"]), int(last["max_predictions"]), batch_size

    def fn(params, inputs):
        mlm, nsp = layout.model(params)(inputs)
        return {"mlm_logits": mlm, "nsp_logits": nsp}

    extra = {}
    if vocab_file:
        with open(vocab_file, "rb") as f:
            extra["vocab.txt"] = f.read()
    return Program(
        fn,
        {
            "input_ids": _struct((B, S), "int32"),
            "segment_ids": _struct((B, S), "int32"),
            "input_mask": _struct((B, S), "int32"),
            "masked_lm_positions": _struct((B, P), "int32"),
        },
        "BERT pretraining heads: masked-LM logits over the vocabulary at each masked "
        "position, and next-sentence logits (label 0: the second segment follows the first).",
        "WordPiece ids of [CLS] a [SEP] b [SEP] (vocab.txt, lowercased"
        f"={bool(trained.config.data.lowercase)}), 0-padded to {S}; segment ids 0 then 1; "
        f"input_mask 1 on tokens; up to {P} [MASK] positions (0-padded).",
        extra,
    )


def transformer_program(translator, batch_size: int, input_length: int) -> Program:
    """The evaluator's beam search (mlperf.transformer.predict.Translator's settings)."""
    task = translator.task
    layout = translator.runner.trained.layout
    e = task.config.eval

    def fn(params, inputs):
        return task.eval_outputs(layout.model(params), {"inputs": inputs["inputs"]})

    extra = {}
    vocab = translator.vocab
    if hasattr(vocab, "serialized_model_proto"):
        extra["vocab.model"] = vocab.serialized_model_proto()
    elif hasattr(vocab, "path"):
        with open(vocab.path, "rb") as f:
            extra["vocab.subwords"] = f.read()
    return Program(
        fn,
        {"inputs": _struct((batch_size, input_length), "int32")},
        f"Beam-search translation (beam {e.beam_size}, length penalty {e.length_penalty}, "
        f"up to {e.max_extra_length} tokens past each input's length): output ids end with "
        "EOS (1), zeros after.",
        "source ids from the vocabulary file (sentencepiece vocab.model, or the reference's "
        "subword file) with EOS (1) appended, 0-padded; decode the outputs with it.",
        extra,
    )


def detector_program(
    trained, batch_size: int, size: int, labels, preprocessing: str, what: str
) -> Program:
    """The task's eval outputs (detections after NMS) of a batch of `size` x `size` images."""
    task, layout = trained.task, trained.layout

    def fn(params, inputs):
        return task.eval_outputs(layout.model(params), {"image": inputs["image"]})

    names = {"category_ids": labels.category_ids, "names": labels.names}
    return Program(
        fn,
        {"image": _struct((batch_size, size, size, 3), "float32")},
        what + " `classes` are contiguous ids; labels.json maps them to COCO category ids "
        "and names (index 0: background).",
        preprocessing,
        {"labels.json": json.dumps(names, indent=1).encode()},
    )


def ssd_program(trained, batch_size: int, labels) -> Program:
    size = int(trained.task.anchors.image_size)
    return detector_program(
        trained,
        batch_size,
        size,
        labels,
        f"the whole image resized to {size} x {size} (bilinear), {IMAGENET_NORMALISATION}.",
        "SSD detections after on-device NMS: boxes (x0, y0, x1, y1) as fractions of the "
        "image, scores, classes, and valid = the number of filled slots per image.",
    )


def maskrcnn_program(trained, batch_size: int, labels) -> Program:
    size = int(trained.task.input_params().image_size)
    return detector_program(
        trained,
        batch_size,
        size,
        labels,
        f"the longer side resized to {size} (aspect kept, bilinear), {IMAGENET_NORMALISATION}, "
        f"zero-padded bottom and right to {size} x {size}; boxes divide by the resize scale "
        "to get back to the image's pixels.",
        "Mask R-CNN detections: boxes (y1, x1, y2, x2) in the input's pixels, scores, "
        "classes, valid (a bool per slot), masks: per-box M x M mask probabilities to paste "
        "inside each box.",
    )

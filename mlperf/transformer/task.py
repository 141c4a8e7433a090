"""MLPerf Transformer (WMT English-German) as a Task: label-smoothed loss on packed rows,
beam-search decoding on the mesh, BLEU from statistics summed over hosts.

Eval: `eval_sums` gives the teacher-forced loss and token accuracy (device sums);
`eval_outputs` runs beam search on the mesh (batch sharded over `data`);
`host_eval_stats` detokenises this host's rows and turns them into BLEU's sufficient
statistics (sacrebleu's, or the v0.7 reference's with eval.bleu=mlperf_v07);
`finalize_eval` sums them over hosts and computes BLEU once.
The target metric is BLEU / 100, the scale MLPerf logs as eval_accuracy (25.0 -> 0.25).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from input_pipeline import packing, translation_vocab
from input_pipeline.translation_data import TranslationData, build_translation_data
from mlperf.config_error import ConfigError
from mlperf.layers.cross_entropy import softmax_cross_entropy
from mlperf.mllog import keys
from mlperf.task import Phase, Task, from_config, single_phase
from mlperf.transformer import bleu, bleu_mlperf, final_bleu
from mlperf.transformer.beam_search import beam_search
from mlperf.transformer.model import Transformer, TransformerConfig
from mlperf.transformer.schedule import rsqrt_schedule
from parallel.precision import policy_from_config

VOCAB_MULTIPLE = 128
BLEU_METHODS = ("sacrebleu", "mlperf_v07")


def smoothed_cross_entropy(
    logits: jax.Array, labels: jax.Array, smoothing: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(label-smoothed loss, plain negative log-likelihood, whether the label has the top
    logit) per position, fp32.

    Soft targets: 1 - smoothing on the label, smoothing / (V - 1) elsewhere; the loss is
    shifted by the soft targets' entropy so that a perfect prediction scores 0.
    """
    vocab = logits.shape[-1]
    loss, nll, top1 = softmax_cross_entropy(logits, labels, smoothing)
    confidence = 1.0 - smoothing
    low = smoothing / (vocab - 1)
    entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))
    return loss - entropy, nll, top1


def eval_rows(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The packed-row fields of unpacked eval pairs: segment 1 on real tokens, positions
    0..L-1."""
    out = {}
    for side in ("inputs", "targets"):
        if side not in batch:  # decoding needs the inputs only
            continue
        tokens = batch[side]
        out[side] = tokens
        out[f"{side}_segmentation"] = (tokens > 0).astype(jnp.int32)
        out[f"{side}_position"] = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return out


class TransformerTask(Task[TranslationData]):
    """MLPerf Transformer translation with BLEU in the loop."""

    benchmark = "transformer"
    target_metric = "bleu_fraction"

    @property
    def target_value(self) -> float:
        return float(self.config.train.target) / 100.0  # BLEU 25.0 -> 0.25

    # ---- data ----------------------------------------------------------------------------
    def prepare(self, shard_index: int, shard_count: int) -> TranslationData:
        """Builds (or loads the cached) vocabulary, dataset and packed rows."""
        del shard_index, shard_count  # every host holds the (small) index; rows are sharded
        if self.bleu_method() == "mlperf_v07":
            bleu_mlperf.tokenize("")  # builds its Unicode classes now, not in the first eval
        return build_translation_data(self.config.data, with_train=True)

    def make_phases(self) -> list[Phase]:
        return [single_phase(self.config, {"length": self.config.data.max_length})]

    def schedule(self):
        """The rsqrt schedule (optimizer.schedule == "rsqrt"), else the loop's linear
        warmup + polynomial decay."""
        o = self.config.optimizer
        if o.get("schedule", "rsqrt") != "rsqrt":
            return super().schedule()
        return rsqrt_schedule(o.learning_rate, o.warmup_steps, o.get("rsqrt_hidden", 0))

    def train_data(self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int):
        return self.data.train_iterator(host_batch_size, self.config.seed, shard_index, shard_count)

    def example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        return {name: ((phase.data["length"],), "int32") for name in packing.PACKED_FIELDS}

    def eval_data(self, global_batch_size: int, shard_index: int, shard_count: int):
        return self.data.eval_batches(global_batch_size, shard_index, shard_count)

    def num_eval_examples(self) -> int:
        return self.data.num_eval_examples

    # ---- model ---------------------------------------------------------------------------
    def model_config(self) -> TransformerConfig:
        # The trained vocabulary wins; without prepared data (inspect, AOT) the config's.
        vocab = self.data.vocab_size if self.has_data else self.config.data.vocab_size
        # Rounded up so that the vocab axis splits evenly over `model`; the extra ids are
        # never targets and are dropped if decoded.
        vocab = VOCAB_MULTIPLE * math.ceil(vocab / VOCAB_MULTIPLE)
        return from_config(
            TransformerConfig,
            self.config.model,
            vocab_size=vocab,
            einsum_gather=self.config.einsum_gather,
            compute_dtype=policy_from_config(
                self.config.precision.compute_dtype, self.config.precision.param_dtype
            ).compute_dtype,
        )

    def build_model(self, rngs: nnx.Rngs) -> Transformer:
        return Transformer(self.model_config(), rngs=rngs)

    # ---- loss ----------------------------------------------------------------------------
    def denominators(self, batch) -> dict[str, jax.Array]:
        tokens = jnp.sum(batch["targets_segmentation"] > 0).astype(jnp.float32)
        return {"tokens": jnp.maximum(tokens, 1.0)}

    def loss(self, model, batch, denominators, rng):
        logits = model(batch, rng=rng)
        weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
        loss, nll, top1 = smoothed_cross_entropy(
            logits, batch["targets"], self.config.label_smoothing
        )
        correct = top1 * weights
        aux = {
            "nll": jnp.sum(nll * weights) / denominators["tokens"],
            "token_accuracy": jnp.sum(correct) / denominators["tokens"],
        }
        return jnp.sum(loss * weights) / denominators["tokens"], aux

    # ---- eval ----------------------------------------------------------------------------
    def eval_sums(self, model, batch) -> dict[str, jax.Array]:
        rows = eval_rows(batch)
        logits = model(rows)
        weights = (rows["targets_segmentation"] > 0) * batch["mask"][:, None]
        weights = weights.astype(jnp.float32)
        _, nll, _ = smoothed_cross_entropy(logits, rows["targets"], 0.0)
        correct = (jnp.argmax(logits, -1) == rows["targets"]) * weights
        return {
            "nll_sum": jnp.sum(nll * weights),
            "tokens": jnp.sum(weights).astype(jnp.int32),
            "correct": jnp.sum(correct).astype(jnp.int32),
            "examples": jnp.sum(batch["mask"]).astype(jnp.int32),
        }

    def eval_outputs(self, model, batch) -> dict[str, jax.Array]:
        """Beam-search translations [B, input length + extra] of the batch's inputs."""
        e = self.config.eval
        rows = eval_rows(batch)
        inputs, segments = rows["inputs"], rows["inputs_segmentation"]
        batch_size, beam = inputs.shape[0], int(e.beam_size)
        encoded = model.encode(inputs, segments, rows["inputs_position"])
        # Beams of one sentence share its encoder output: cross-attention K/V are
        # computed once and repeated (beam-major rows), never reordered.
        cross = jax.tree.map(lambda x: jnp.repeat(x, beam, axis=0), model.cross_cache(encoded))
        segments_rep = jnp.repeat(segments, beam, axis=0)
        max_length = inputs.shape[1] + int(e.max_extra_length)
        limits = jnp.sum(segments, axis=1) + int(e.max_extra_length)

        def step(tokens, cache, index):
            return model.decode_step(tokens, cache, cross, index, segments_rep)

        tokens, _ = beam_search(
            step,
            model.self_cache(batch_size * beam, max_length),
            batch_size,
            beam,
            max_length,
            translation_vocab.EOS_ID,
            float(e.length_penalty),
            limits,
            one_hot_reorder=self.config.einsum_gather,
        )
        return {"tokens": tokens}

    def translations(self, outputs: list[dict], batches: list[dict]) -> tuple[list, list]:
        """(hypotheses, references) of this host's real eval rows, in order."""
        data = self.data
        hyps, refs = [], []
        for out, b in zip(outputs, batches, strict=True):
            for tokens, index, mask in zip(out["tokens"], b["index"], b["mask"], strict=True):
                if mask > 0:
                    hyps.append(data.decode(tokens))
                    refs.append(data.references[int(index)])
        return hyps, refs

    def host_eval_stats(self, outputs: list[dict], batches: list[dict]) -> dict[str, np.ndarray]:
        hyps, refs = self.translations(outputs, batches)
        if self.bleu_method() == "mlperf_v07":
            return {"bleu_stats": bleu_mlperf.bleu_stats(hyps, refs)}
        return {"bleu_stats": bleu.bleu_stats(hyps, refs)}

    def bleu_method(self) -> str:
        """eval.bleu: "sacrebleu" (13a, cased) or "mlperf_v07" (the v0.7 reference's
        uncased BLEU, mlperf/transformer/bleu_mlperf.py)."""
        method = self.config.eval.get("bleu", "sacrebleu")
        if method not in BLEU_METHODS:
            raise ConfigError(f"eval.bleu must be one of {BLEU_METHODS}, got {method!r}")
        return method

    def finalize_eval(self, sums: dict[str, Any]) -> dict[str, float]:
        tokens = max(int(sums["tokens"]), 1)
        metrics = {
            "eval_loss": float(sums["nll_sum"]) / tokens,
            "token_accuracy": int(sums["correct"]) / tokens,
            "eval_examples": int(sums["examples"]),
        }
        if "bleu_stats" in sums:
            module = bleu_mlperf if self.bleu_method() == "mlperf_v07" else bleu
            metrics.update(module.bleu_from_stats(sums["bleu_stats"]))
            metrics["bleu_fraction"] = metrics["bleu"] / 100.0
        return metrics

    def final_eval_sets(self) -> dict[str, Callable[[], TransformerTask]]:
        """Every whole set of config.eval.final_sets (val, test), for BLEU once after
        training: the in-loop eval only decodes data.max_eval_examples sentences. Empty
        when the config names no final sets."""
        return final_bleu.final_sets(self)

    # ---- reporting -----------------------------------------------------------------------
    def mllog_metadata(self) -> dict[str, dict[str, Any]]:
        """Metadata the 0.7.0 rules require on some hyperparameter events: over-long
        training pairs are discarded (eval inputs are truncated)."""
        return {keys.MAX_SEQUENCE_LENGTH: {"method": "discard"}}

    def mllog_hparams(self) -> dict[str, Any]:
        o = self.config.optimizer
        return {
            keys.OPT_NAME: "adam",
            keys.OPT_BASE_LR: o.learning_rate,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "opt_adam_beta_1": o.b1,
            "opt_adam_beta_2": o.b2,
            "opt_adam_epsilon": o.eps,
            keys.MAX_SEQUENCE_LENGTH: self.config.data.max_length,
        }

    def flops_per_example(self, phase: Phase) -> float:
        """Training FLOPs of one packed row: 6 x matmul params per token x tokens, plus
        attention scores and the (tied) output projection."""
        m = self.model_config()
        length = phase.data["length"]
        d, f, n, v = m.emb_dim, m.mlp_dim, m.num_layers, m.vocab_size
        encoder = n * (2 * (4 * d * d + 2 * d * f) + 4 * length * d)
        decoder = n * (2 * (8 * d * d + 2 * d * f) + 8 * length * d) + 2 * d * v
        embed = 2 * v * d * 2 if m.einsum_gather else 0  # one-hot lookups, both sides
        return 3.0 * length * (encoder + decoder + embed)

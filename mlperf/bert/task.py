"""BERT pretraining as a Task: masked-LM + next-sentence loss, masked-LM accuracy target."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from input_pipeline import bert_packing
from input_pipeline.bert_data import BertData, build_bert_data
from input_pipeline.pretraining_examples import feature_spec
from mlperf.bert import rules
from mlperf.bert.checkpoint_import import PretrainedBert, check_config, open_source
from mlperf.bert.model import BertConfig, BertForPreTraining
from mlperf.config_error import ConfigError
from mlperf.layers.cross_entropy import softmax_cross_entropy
from mlperf.mllog import keys
from mlperf.task import Phase, Task, from_config
from parallel.precision import policy_from_config


def _sequence_weights(batch) -> jax.Array:
    """1 per real sequence, fp32: a packed batch's next_sentence_weights [B, K], else
    ones [B]."""
    if "next_sentence_weights" in batch:
        return batch["next_sentence_weights"].astype(jnp.float32)
    return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


@dataclasses.dataclass(frozen=True)
class BertPrepared:
    """What BertTask.prepare builds: the data of each phase's input shape on this shard,
    keyed by (seq_length, max_predictions, shard_index, shard_count)."""

    data: Mapping[tuple[int, int, int, int], BertData]

    @property
    def vocab_size(self) -> int:
        return next(iter(self.data.values())).vocab_size

    @property
    def num_eval_examples(self) -> int:
        return next(iter(self.data.values())).num_eval_examples


class BertTask(Task[BertPrepared]):
    """MLPerf BERT pretraining (phase 1 and optional phase 2)."""

    benchmark = "bert"
    target_metric = "mlm_accuracy"

    @property
    def mlperf_round(self) -> str:
        """The MLPerf round whose rules apply (config mlperf.round)."""
        return str(self.config.get("mlperf", {}).get("round", "0.7"))

    @property
    def target_value(self) -> float:
        """train.target, or the round's target when it is < 0 (0.712 in v0.7, 0.720 from
        v1.0 on)."""
        round_target = rules.round_target(self.mlperf_round)  # checks the round
        target = float(self.config.train.target)
        return round_target if target < 0 else target

    # ---- data ----------------------------------------------------------------------------
    def _bert_data(
        self, seq_length: int, max_predictions: int, shard_index: int, shard_count: int
    ) -> BertData:
        key = (seq_length, max_predictions, shard_index, shard_count)
        if self.has_data and key in self.data.data:
            return self.data.data[key]
        return build_bert_data(self.config.data, seq_length, max_predictions, *key[2:])

    def prepare(self, shard_index: int, shard_count: int) -> BertPrepared:
        """Builds (or loads the cached) data for every phase before anything compiles."""
        if self._init_checkpoint():  # a checkpoint of another model fails before the data
            source = open_source(self._init_checkpoint())
            check_config(source.config_path, self.model_config(), source.format.startswith("TF1"))
        for phase in self.phases():
            self.packing(phase)  # a bad data.packing fails before the data is built
        data = {}
        for phase in self.phases():
            key = (phase.data["seq_length"], phase.data["max_predictions"])
            data[(*key, shard_index, shard_count)] = self._bert_data(*key, shard_index, shard_count)
        return BertPrepared(data)

    def packing(self, phase: Phase) -> bert_packing.PackingConfig | None:
        """The phase's sequence packing (`data.packing`); None when it is off."""
        return bert_packing.packing_config(
            self.config.data, phase.data["seq_length"], phase.data["max_predictions"]
        )

    def train_data(self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int):
        data = self._bert_data(
            phase.data["seq_length"], phase.data["max_predictions"], shard_index, shard_count
        )
        packing = self.packing(phase)
        if packing is not None:
            return data.packed_train_iterator(host_batch_size, packing, seed=self.config.seed)
        return data.train_iterator(
            host_batch_size,
            seed=self.config.seed,
            worker_count=self.config.data.get("input_workers", 0),
            read_threads=self.config.data.get("read_threads", None),
        )

    def eval_data(self, global_batch_size: int, shard_index: int, shard_count: int):
        last = self.phases()[-1]
        data = self._bert_data(
            last.data["seq_length"], last.data["max_predictions"], shard_index, shard_count
        )
        return data.eval_batches(global_batch_size)

    def rules_eval_schedule(self, phases: Sequence[Phase]) -> tuple[int, int]:
        """(first eval, eval interval) in samples under the MLPerf rules of mlperf.round."""
        return rules.eval_schedule(self.mlperf_round, phases[-1].global_batch_size)

    def example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        packing = self.packing(phase)
        if packing is not None:
            return bert_packing.packed_feature_spec(packing)
        return feature_spec(phase.data["seq_length"], phase.data["max_predictions"])

    def eval_example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        # The eval set is never packed: the metrics are the reference's, example by example.
        spec = feature_spec(phase.data["seq_length"], phase.data["max_predictions"])
        return {**spec, "mask": ((), "float32")}

    def step_samples(self, host_batch: Mapping[str, np.ndarray], phase: Phase) -> int:
        """Sequences in the global batch: one per row, or with packing the packed
        sequences of every host's rows (the MLPerf log counts original sequences)."""
        if "next_sentence_weights" not in host_batch:
            return phase.global_batch_size
        count = int(np.sum(host_batch["next_sentence_weights"]))
        if jax.process_count() > 1:
            count = int(np.sum(multihost_utils.process_allgather(np.int64(count))))
        return count

    def step_samples_vary(self, phase: Phase) -> bool:
        return self.packing(phase) is not None

    def num_eval_examples(self) -> int:
        return self.data.num_eval_examples

    # ---- phases --------------------------------------------------------------------------
    def make_phases(self) -> list[Phase]:
        c = self.config
        p2 = c.phase2
        phase1_steps = c.train.steps
        if p2.enabled:
            if p2.start_samples <= 0 or p2.steps <= 0:
                raise ConfigError(
                    "phase2.enabled needs phase2.start_samples > 0 and phase2.steps > 0."
                )
            # A batch size <= 0 is named by validate (mlperf/validate.py check_phases).
            phase1_steps = math.ceil(p2.start_samples / max(c.train.global_batch_size, 1))
        phases = [
            Phase(
                name="phase1",
                global_batch_size=c.train.global_batch_size,
                steps=phase1_steps,
                learning_rate=c.optimizer.learning_rate,
                warmup_steps=c.optimizer.warmup_steps,
                decay_steps=c.optimizer.decay_steps or c.train.steps,
                data={"seq_length": c.data.seq_length, "max_predictions": c.data.max_predictions},
                microbatches=c.train.microbatches,
            )
        ]
        if p2.enabled:
            phases.append(
                Phase(
                    name="phase2",
                    global_batch_size=p2.global_batch_size,
                    steps=p2.steps,
                    learning_rate=p2.learning_rate,
                    warmup_steps=p2.warmup_steps,
                    decay_steps=p2.steps,
                    data={"seq_length": p2.seq_length, "max_predictions": p2.max_predictions},
                    microbatches=c.train.microbatches,
                    source="phase2",
                )
            )
        return phases

    # ---- model ---------------------------------------------------------------------------
    def model_config(self) -> BertConfig:
        m = self.config.model
        # The data's vocabulary wins; without prepared data (inspect, AOT) the config's.
        vocab = m.vocab_size or self.config.data.vocab_size
        if self.has_data:
            vocab = self.data.vocab_size
        # A config may pad the table (30522 -> 30528) so the vocab splits over `model`.
        vocab = max(vocab, m.vocab_size)
        # Rows past the tokenizer's vocabulary are padding: never predicted.
        real = self.data.vocab_size if self.has_data else self.config.data.vocab_size
        real = min(real or vocab, vocab)
        return from_config(
            BertConfig,
            m,
            vocab_size=vocab,
            valid_vocab_size=real if real < vocab else 0,
            einsum_gather=self.config.einsum_gather,
            compute_dtype=policy_from_config(
                self.config.precision.compute_dtype, self.config.precision.param_dtype
            ).compute_dtype,
        )

    def build_model(self, rngs: nnx.Rngs) -> BertForPreTraining:
        return BertForPreTraining(self.model_config(), rngs=rngs)

    def _init_checkpoint(self) -> str:
        init = self.config.get("init")
        return init.get("checkpoint", "") if init is not None else ""

    def pretrained(self, param_shapes) -> PretrainedBert | None:
        """`init.checkpoint` (TF1 or Hugging Face), checked against the model config."""
        path = self._init_checkpoint()
        return PretrainedBert(path, self.model_config(), param_shapes) if path else None

    # ---- loss and eval -------------------------------------------------------------------
    def denominators(self, batch) -> dict[str, jax.Array]:
        # Means over the masked tokens and over the sequences of the whole batch, as the
        # reference's; a packed batch counts its packed sequences, so both losses are
        # those of the same sequences unpacked.
        return {
            "mlm": jnp.maximum(batch["masked_lm_weights"].sum(), 1.0),
            "nsp": jnp.maximum(_sequence_weights(batch).sum(), 1.0),
        }

    def loss(self, model, batch, denominators, rng):
        mlm_xent, mlm_top1, nsp_logits = model.train_heads(batch, rng=rng)
        weights = batch["masked_lm_weights"].astype(jnp.float32)
        nsp_xent, _, _ = softmax_cross_entropy(nsp_logits, batch["next_sentence_labels"])
        mlm_loss = jnp.sum(mlm_xent * weights) / denominators["mlm"]
        nsp_loss = jnp.sum(nsp_xent * _sequence_weights(batch)) / denominators["nsp"]
        correct = mlm_top1 * weights
        aux = {
            "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss,
            "mlm_accuracy": jnp.sum(correct) / denominators["mlm"],
        }
        return mlm_loss + nsp_loss, aux

    def eval_sums(self, model, batch) -> dict[str, jax.Array]:
        mlm_xent, mlm_hits, nsp_logits = model.eval_heads(batch)
        example = batch["mask"].astype(jnp.float32)
        weights = batch["masked_lm_weights"].astype(jnp.float32) * example[:, None]
        correct = mlm_hits * weights
        nsp_correct = (jnp.argmax(nsp_logits, -1) == batch["next_sentence_labels"]) * example
        # Counts are integers (exact under any sharding); losses are fp32 sums.
        return {
            "mlm_correct": jnp.sum(correct).astype(jnp.int32),
            "mlm_count": jnp.sum(weights).astype(jnp.int32),
            "nsp_correct": jnp.sum(nsp_correct).astype(jnp.int32),
            "examples": jnp.sum(example).astype(jnp.int32),
            "mlm_loss_sum": jnp.sum(mlm_xent * weights),
        }

    def finalize_eval(self, sums: dict[str, Any]) -> dict[str, float]:
        count = max(int(sums["mlm_count"]), 1)
        examples = max(int(sums["examples"]), 1)
        return {
            "mlm_accuracy": int(sums["mlm_correct"]) / count,
            "mlm_loss": float(sums["mlm_loss_sum"]) / count,
            "nsp_accuracy": int(sums["nsp_correct"]) / examples,
            "eval_examples": int(sums["examples"]),
        }

    # ---- reporting -----------------------------------------------------------------------
    def mllog_hparams(self) -> dict[str, Any]:
        c = self.config
        o = c.optimizer
        return {
            keys.OPT_BASE_LR: o.learning_rate,
            keys.OPT_LAMB_EPSILON: o.eps,
            "opt_epsilon": o.eps,
            "opt_learning_rate_training_steps": o.decay_steps or c.train.steps,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            keys.NUM_WARMUP_STEPS: o.warmup_steps,
            keys.START_WARMUP_STEP: 0,
            keys.OPT_LAMB_BETA_1: o.b1,
            keys.OPT_LAMB_BETA_2: o.b2,
            keys.OPT_LAMB_WEIGHT_DECAY: o.weight_decay,
            keys.OPT_LAMB_LR_DECAY_POLY_POWER: o.power,
            keys.MAX_SEQUENCE_LENGTH: c.data.seq_length,
            "max_predictions_per_seq": c.data.max_predictions,
            "gradient_accumulation_steps": self.phases()[0].microbatches,
        }

    def flops_per_example(self, phase: Phase) -> float:
        """6 x (matmul params touched per token) x tokens, plus attention and MLM head.

        With `last_layer_head_positions_only` the last layer counts what it computes: keys
        and values for every row, the rest for [CLS] and the masked positions only."""
        m = self.model_config()
        seq = phase.data["seq_length"]
        preds = phase.data["max_predictions"]
        d, f, n = m.hidden_size, m.mlp_dim, m.num_layers
        per_token_layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * seq * d  # proj + attention
        forward = seq * n * per_token_layer + preds * 2 * (d * d + d * m.vocab_size)
        if m.last_layer_head_positions_only and n:
            rows = min(preds + 1, seq)
            forward -= (seq - rows) * (per_token_layer - 2 * 2 * d * d)  # K, V stay
        if m.einsum_gather:
            forward += seq * 2 * m.vocab_size * d  # one-hot embedding matmul
        return 3.0 * forward  # backward ~ 2x forward

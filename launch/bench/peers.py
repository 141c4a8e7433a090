"""Our models against their PyTorch peers, trained on one CPU device in one process.

    python -m launch.bench.peers [--peer_sizes tiny,base] [--rounds 5] [--peer_steps 3]

BERT: our `mlperf.bert` pretraining step against Hugging Face `BertForPreTraining`
at the same size, batch, dtype, dropout and optimizer (AdamW), both from random
init on the same synthetic batch. The dtype is fp32, or with `--peer_dtype bfloat16` ours
in bf16 compute (fp32 parameters) against torch under `torch.autocast("cpu",
torch.bfloat16)`. Transformer: our `mlperf.transformer` against
`torch.nn.Transformer` (launch/torch_transformer.py, the model `launch.export --format
torch` writes a Transformer run for) with the same dimensions (pre-LN, ReLU, shared
embedding tied to the output projection, sinusoidal positions, label smoothing 0.1,
Adam), one padded sentence pair per row. Ours uses gathers for lookups, the CPU choice
of the configs (`einsum_gather=False`; `--peer_einsum_gather` times the TPU one-hot path
for BERT).

The two sides alternate A B A B in one process, so machine load that comes and goes
(the CPUs are shared) hits both alike; each round times `steps` train steps of each
side, the warm-up rounds are discarded (the first, and more while a side's steps still
grow the process's memory: `alternate`), and the median samples/s of the rest is reported
with the ratio ours / peer.

Differences that are part of the designs, not of this benchmark: Hugging Face computes
the masked-LM head over all L positions ([B, L, V] logits, labels -100 elsewhere); ours
gathers the P masked positions first ([B, P, V]), as the MLPerf reference does.
`--peer_last_layer_rows` also makes our last encoder layer at [CLS] and the masked
positions only (`model.last_layer_head_positions_only`, as `bert:wikitext`): the same
outputs with less work, which Hugging Face's model has no setting for.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import flags

from launch.bench.common import ROUNDS, one_device_peers, print_rows, run
from launch.bench.peer_ceiling import add_utilisation, matmul_peak
from launch.cli import usage_error

_MODELS = flags.DEFINE_list("peer_models", ["bert", "transformer"], "Models.")
_SIZES = flags.DEFINE_list("peer_sizes", ["tiny", "base"], "Sizes (tiny, base).")
_STEPS = flags.DEFINE_integer("peer_steps", 3, "Train steps per side per round.")
_LAST_ROWS = flags.DEFINE_bool(
    "peer_last_layer_rows",
    False,
    "Our BERT's last layer at the heads' rows only (model.last_layer_head_positions_only).",
)
_DTYPE = flags.DEFINE_enum(
    "peer_dtype",
    "float32",
    ["float32", "bfloat16"],
    "Compute dtype of both sides (bfloat16: ours in bf16, torch under CPU autocast).",
)
_EINSUM = flags.DEFINE_bool(
    "peer_einsum_gather", False, "Our one-hot einsum lookups (the TPU choice) on CPU."
)


@dataclasses.dataclass(frozen=True)
class BertSize:
    """One comparison point: model size, sequence and batch."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    seq_length: int
    max_predictions: int
    batch_size: int
    dropout_rate: float


BERT_SIZES = {
    # configs/bert.py:tiny's model at its sequence length and global batch.
    "tiny": BertSize("tiny", 2048, 128, 2, 4, 512, 32, 5, 64, 0.0),
    # BERT-base at phase-1 sequence length; a small batch so a step fits a shared CPU.
    "base": BertSize("base", 30522, 768, 12, 12, 3072, 128, 20, 8, 0.1),
}


def synthetic_bert_batch(size: BertSize, seed: int = 0) -> dict[str, np.ndarray]:
    """A deterministic pretraining batch: padded sequences, P masked positions each."""
    rng = np.random.default_rng(seed)
    b, seq, preds = size.batch_size, size.seq_length, size.max_predictions
    lengths = rng.integers(seq // 2, seq + 1, size=b)
    input_mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    input_ids = rng.integers(5, size.vocab_size, size=(b, seq)).astype(np.int32) * input_mask
    segment_ids = ((np.arange(seq)[None] >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    positions = np.stack(
        [np.sort(rng.choice(np.arange(1, seq // 2), preds, replace=False)) for _ in range(b)]
    ).astype(np.int32)
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(5, size.vocab_size, size=(b, preds)).astype(np.int32),
        "masked_lm_weights": np.ones((b, preds), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=(b,)).astype(np.int32),
    }


def ours_bert_step(
    size: BertSize, einsum_gather: bool, last_layer_rows: bool = False, dtype: str = "float32"
) -> OurStep:
    """Our compiled BERT train step on one device (call it to run one step).
    `last_layer_rows`: model.last_layer_head_positions_only; `dtype`: the compute dtype
    (parameters stay fp32)."""
    from configs.bert import get_config
    from mlperf.trainer import build_trainer

    c = get_config("tiny")
    c.model.update(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_layers=size.num_layers,
        num_heads=size.num_heads,
        mlp_dim=size.mlp_dim,
        max_position=max(size.seq_length, 64),
        dropout_rate=size.dropout_rate,
        last_layer_head_positions_only=last_layer_rows,
    )
    c.data.update(
        seq_length=size.seq_length, max_predictions=size.max_predictions, vocab_size=size.vocab_size
    )
    c.einsum_gather = einsum_gather
    c.precision.compute_dtype = dtype
    c.optimizer.update(name="adamw", learning_rate=1e-4, warmup_steps=0, weight_decay=0.01)
    c.train.update(global_batch_size=size.batch_size, steps=1000, eval_batch_size=size.batch_size)
    c.mesh.ici_shape = (1, 1)
    trainer = build_trainer(c, devices=jax.devices()[:1], prepare_data=False)
    return OurStep(trainer, synthetic_bert_batch(size))


def hf_bert_step(
    size: BertSize, gathered_head: bool = False, dtype: str = "float32"
) -> Callable[[], Any]:
    """Hugging Face BertForPreTraining + torch AdamW; returns a closure running one step.

    `gathered_head=False`: the stock model with MLM labels (-100 off the masked
    positions), whose head runs over all L positions. `True`: the same modules, with the
    masked-LM head applied to the P masked positions only, as ours and the MLPerf
    reference do, so both sides do the same FLOPs.
    """
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        intermediate_size=size.mlp_dim,
        hidden_act="gelu",
        hidden_dropout_prob=size.dropout_rate,
        attention_probs_dropout_prob=size.dropout_rate,
        max_position_embeddings=max(size.seq_length, 64),
        type_vocab_size=2,
    )
    model = transformers.BertForPreTraining(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    b = synthetic_bert_batch(size)
    inputs = {
        "input_ids": torch.from_numpy(b["input_ids"].astype(np.int64)),
        "attention_mask": torch.from_numpy(b["input_mask"].astype(np.int64)),
        "token_type_ids": torch.from_numpy(b["segment_ids"].astype(np.int64)),
    }
    nsp_labels = torch.from_numpy(b["next_sentence_labels"].astype(np.int64))
    positions = torch.from_numpy(b["masked_lm_positions"].astype(np.int64))
    mlm_ids = torch.from_numpy(b["masked_lm_ids"].astype(np.int64))
    labels = np.full(b["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, b["masked_lm_positions"], b["masked_lm_ids"], axis=1)
    labels = torch.from_numpy(labels)
    rows = torch.arange(size.batch_size)[:, None]

    def loss_stock():
        return model(**inputs, labels=labels, next_sentence_label=nsp_labels).loss

    def loss_gathered():
        sequence, pooled = model.bert(**inputs)[:2]
        mlm_logits, nsp_logits = model.cls(sequence[rows, positions], pooled)
        ce = torch.nn.functional.cross_entropy
        return ce(mlm_logits.flatten(0, 1), mlm_ids.flatten()) + ce(nsp_logits, nsp_labels)

    loss_fn = loss_gathered if gathered_head else loss_stock
    precision = _torch_precision(dtype)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with precision():
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def _label(model: str, size: str, dtype: str) -> str:
    """A table row's comparison name: `bert:base`, or `bert:base bf16` in bfloat16."""
    return f"{model}:{size}" + ("" if dtype == "float32" else " bf16")


PEER_DTYPES = ("float32", "bfloat16")


def check_dtype(dtype: str) -> None:
    """A clear error for a compute dtype the comparison has no peer setting for."""
    if dtype not in PEER_DTYPES:
        raise ValueError(f"unknown peer dtype {dtype!r}; choose float32 or bfloat16.")


def _torch_precision(dtype: str) -> Callable[[], Any]:
    """A context factory for torch's side: autocast to bf16 on CPU, or nothing (fp32)."""
    import contextlib

    import torch

    check_dtype(dtype)
    if dtype == "bfloat16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


# A warm-up round is settled when no side's steps grew the process's resident memory by
# more than this a step: in one process with a peer, our step's scratch memory keeps
# finding fresh heap for its first few rounds (~10,000 page faults a step, 1.4-1.7x its
# settled time for BERT tiny), the peer's allocations having taken the freed blocks.
SETTLED_GROWTH_PER_STEP = 1 << 20


def _resident_bytes() -> int:
    """The process's resident memory now (Linux: /proc/self/statm); 0 where unknown, so
    that elsewhere the warm-up is the rounds asked for."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def alternate(
    sides: dict[str, Callable[[], Any]],
    batch_size: int,
    rounds: int,
    steps: int,
    warmup: int,
    max_warmup: int | None = None,
) -> tuple[dict[str, list[float]], int]:
    """Samples/s per timed round of each side, timed A B A B, and the warm-up rounds
    dropped before them: at least `warmup`, and more while a round of some side grew the
    process's resident memory by more than SETTLED_GROWTH_PER_STEP a step, up to `max_warmup`
    (default `warmup + 4`)."""
    max_warmup = warmup + 4 if max_warmup is None else max(max_warmup, warmup)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    warmed = timed = 0
    while timed < rounds:
        round_rates, settled = {}, True
        for name, step in sides.items():
            resident = _resident_bytes()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            elapsed = time.perf_counter() - start
            round_rates[name] = steps * batch_size / elapsed
            settled &= (_resident_bytes() - resident) / steps <= SETTLED_GROWTH_PER_STEP
        if warmed < warmup or (not settled and warmed < max_warmup):
            warmed += 1
            continue
        for name, rate in round_rates.items():
            rates[name].append(rate)
        timed += 1
    return rates, warmed


def compare(
    label: str,
    sides: dict[str, Callable[[], Any]],
    batch_size: int,
    rounds: int,
    steps: int,
    warmup: int = 1,
    peak: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per peer: median samples/s of ours (the first side) and of that peer,
    their ratio, and every round's rates. All sides alternate in the same rounds. With
    the matmul `peak` (`peer_ceiling.matmul_peak`) and ours an `OurStep`, the rows also
    carry both sides' MFU and the ceiling (`peer_ceiling.add_utilisation`)."""
    rates, warmed = alternate(sides, batch_size, rounds, steps, warmup)
    ours, *peers = list(sides)
    med = {name: statistics.median(r) for name, r in rates.items()}
    rows = [
        {
            "comparison": label,
            "ours": ours,
            "peer": peer,
            "batch_size": batch_size,
            "ours_samples_per_s": med[ours],
            "peer_samples_per_s": med[peer],
            "ratio": med[ours] / med[peer],
            "rounds": {ours: rates[ours], peer: rates[peer]},
            "warmup_rounds": warmed,
        }
        for peer in peers
    ]
    flops = getattr(sides[ours], "flops_per_example", None)
    if peak and flops:
        for row in rows:
            add_utilisation(row, flops, peak)
    return rows


def bench_bert(
    size: BertSize,
    rounds: int,
    steps: int,
    einsum_gather: bool,
    last_layer_rows: bool = False,
    dtype: str = "float32",
    peak: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Our BERT against Hugging Face's (stock, and with the head on masked positions).
    With `peak`, the rows carry MFU and the ceiling, except with `last_layer_rows`: then
    ours does fewer FLOPs than the peers."""
    sides = {
        "ours": ours_bert_step(size, einsum_gather, last_layer_rows, dtype),
        "hf_bert": hf_bert_step(size, dtype=dtype),
        "hf_bert_gathered": hf_bert_step(size, gathered_head=True, dtype=dtype),
    }
    peak = None if last_layer_rows else peak
    label = _label("bert", size.name, dtype)
    rows = compare(label, sides, size.batch_size, rounds, steps, peak=peak)
    for row in rows:
        row["size"] = dataclasses.asdict(size)
        row["einsum_gather"] = einsum_gather
        row["last_layer_rows"] = last_layer_rows
        row["dtype"] = dtype
    return rows


@dataclasses.dataclass(frozen=True)
class TransformerSize:
    """One Transformer comparison point (one sentence pair per row, padded)."""

    name: str
    vocab_size: int
    emb_dim: int
    num_heads: int
    num_layers: int
    mlp_dim: int
    length: int
    batch_size: int
    dropout_rate: float


TRANSFORMER_SIZES = {
    # configs/transformer.py:tiny's model, row length and global batch.
    "tiny": TransformerSize("tiny", 128, 64, 4, 2, 256, 64, 32, 0.0),
    # Transformer-base (6+6 layers, 512/2048/8), rows of 64 tokens, a CPU-sized batch.
    "base": TransformerSize("base", 32768, 512, 8, 6, 2048, 64, 8, 0.1),
}


def synthetic_translation_batch(size: TransformerSize, seed: int = 0) -> dict[str, np.ndarray]:
    """One pair per row, padded: the packed fields with segment 1 and positions 0..n-1."""
    rng = np.random.default_rng(seed)
    b, length = size.batch_size, size.length
    out = {}
    for side in ("inputs", "targets"):
        lengths = rng.integers(length // 2, length + 1, size=b)
        real = np.arange(length)[None] < lengths[:, None]
        out[side] = (rng.integers(2, size.vocab_size, size=(b, length)) * real).astype(np.int32)
        out[f"{side}_segmentation"] = real.astype(np.int32)
        out[f"{side}_position"] = (np.arange(length)[None] * real).astype(np.int32)
    return out


def ours_transformer_step(size: TransformerSize, dtype: str = "float32") -> OurStep:
    """Our compiled Transformer train step on one device (gathers, the CPU choice) in
    compute dtype `dtype`."""
    from configs.transformer import get_config
    from mlperf.trainer import build_trainer

    c = get_config("tiny")
    c.model.update(
        emb_dim=size.emb_dim,
        num_heads=size.num_heads,
        num_layers=size.num_layers,
        mlp_dim=size.mlp_dim,
        dropout_rate=size.dropout_rate,
        attention_dropout_rate=size.dropout_rate,
    )
    c.data.update(vocab_size=size.vocab_size, max_length=size.length)
    c.einsum_gather = False
    c.precision.compute_dtype = dtype
    c.train.update(global_batch_size=size.batch_size, steps=1000, eval_batch_size=size.batch_size)
    c.mesh.ici_shape = (1, 1)
    trainer = build_trainer(c, devices=jax.devices()[:1], prepare_data=False)
    return OurStep(trainer, synthetic_translation_batch(size))


class OurStep:
    """Our compiled train step on one batch: calling it runs one step and returns the
    loss; `flops_per_example` is the task's model FLOPs per example (MFU's numerator)."""

    def __init__(self, trainer, host_batch: dict[str, np.ndarray]):
        phase = trainer.phases[0]
        layout = trainer.partitioner.data_layout(phase.global_batch_size)
        self.compiled = trainer.lower_train_step(phase).compile()
        self._state = trainer.init_state()
        self._key = trainer.partitioner.replicate(lambda: jax.random.key(0))
        self._batch = trainer.partitioner.host_to_global(host_batch, layout)
        self.flops_per_example = float(trainer.task.flops_per_example(phase))

    def __call__(self) -> float:
        self._state, metrics = self.compiled(self._state, self._batch, self._key)
        return float(jax.block_until_ready(metrics["loss"]))


def torch_transformer_step(size: TransformerSize, dtype: str = "float32") -> Callable[[], Any]:
    """Our Transformer's torch peer (launch/torch_transformer.py: torch.nn.Transformer,
    pre-LN, ReLU, same dims, shared embedding tied to the output projection, sinusoidal
    positions), label-smoothed loss, torch Adam; `dtype` as in `hf_bert_step`."""
    import torch

    from launch.torch_transformer import TorchTransformer

    torch.manual_seed(0)
    model = TorchTransformer(
        size.vocab_size,
        size.emb_dim,
        size.num_heads,
        size.num_layers,
        size.mlp_dim,
        dropout_rate=size.dropout_rate,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    b = {
        k: torch.from_numpy(v.astype(np.int64))
        for k, v in synthetic_translation_batch(size).items()
    }
    weights = (b["targets_segmentation"] > 0).float()
    precision = _torch_precision(dtype)

    def forward():
        logits = model(**b)
        xent = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), b["targets"].flatten(), reduction="none", label_smoothing=0.1
        )
        return (xent * weights.flatten()).sum() / weights.sum()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with precision():
            loss = forward()
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def bench_transformer(
    sizes: list[str],
    rounds: int,
    steps: int,
    dtype: str = "float32",
    peak: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Our Transformer against torch.nn.Transformer at each size (with `peak`: MFU and
    the ceiling in the rows)."""
    rows = []
    for name in sizes:
        size = TRANSFORMER_SIZES[name]
        sides = {
            "ours": ours_transformer_step(size, dtype),
            "torch_transformer": torch_transformer_step(size, dtype),
        }
        label = _label("transformer", name, dtype)
        for row in compare(label, sides, size.batch_size, rounds, steps, peak=peak):
            row["size"] = dataclasses.asdict(size)
            row["dtype"] = dtype
            rows.append(row)
    return rows


def run_peers(
    models: list[str],
    sizes: list[str],
    rounds: int,
    steps: int,
    einsum_gather: bool,
    last_layer_rows: bool = False,
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """Every requested comparison in compute dtype `dtype` (float32, or bfloat16 against
    torch's CPU autocast), with both sides' MFU against the matmul peak of the same
    threads, measured once first."""
    unknown = [s for s in sizes if s not in BERT_SIZES]
    if unknown:
        raise ValueError(f"unknown peer sizes {unknown}; choose from {sorted(BERT_SIZES)}.")
    unknown = [m for m in models if m not in ("bert", "transformer")]
    if unknown:
        raise ValueError(f"unknown peer model {unknown[0]!r}; choose bert or transformer.")
    check_dtype(dtype)
    peak = matmul_peak(dtype)
    rows = []
    for model in models:
        if model == "bert":
            for s in sizes:
                rows += bench_bert(
                    BERT_SIZES[s], rounds, steps, einsum_gather, last_layer_rows, dtype, peak
                )
        else:
            rows += bench_transformer(sizes, rounds, steps, dtype, peak)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width table: comparison, batch, samples/s of both sides, ratio, and where
    measured both sides' MFU and the ceiling (`peer_ceiling`)."""
    lines = [
        f"{'comparison':<20} {'batch':>5} {'ours/s':>10} {'peer':<18} {'peer/s':>10} {'ratio':>6}"
        f" {'ours MFU':>8} {'peer MFU':>8} {'ceiling':>7}"
    ]
    for r in rows:
        line = (
            f"{r['comparison']:<20} {r['batch_size']:>5} {r['ours_samples_per_s']:>10.1f} "
            f"{r['peer']:<18} {r['peer_samples_per_s']:>10.1f} {r['ratio']:>5.2f}x"
        )
        if "ceiling" in r:
            line += f" {r['ours_mfu']:>8.1%} {r['peer_mfu']:>8.1%} {r['ceiling']:>6.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    one_device_peers()  # before jax starts its backend
    try:
        rows = run_peers(
            _MODELS.value,
            _SIZES.value,
            ROUNDS.value,
            _STEPS.value,
            _EINSUM.value,
            _LAST_ROWS.value,
            _DTYPE.value,
        )
    except ValueError as e:
        usage_error(f"peers: {e}")
    print_rows(rows, table)


if __name__ == "__main__":
    run(main, keep_memory=False)  # one_device_peers keeps host memory by default

"""BERT pretraining configs: `--config configs/bert.py:<variant>`.

Variants: tiny (embedded stdlib-docstring corpus, CPU, minutes; `make run`),
wikitext (WikiText-2 + tiny-shakespeare with the real bert-base-uncased vocab, under
data.data_dir), wikitext_packed (wikitext with sequence packing),
tiny_tfrecord (the tiny model on the committed reference-format TFRecord fixture),
base, large, mlperf_v07 (Google's MLPerf v0.7 JAX run: BERT-large, GBS 8192, LAMB);
base, large and mlperf_v07 read the MLPerf reference's TFRecords from data.data_dir.
Any value can be overridden: `--config.train.global_batch_size=128`.
"""

from ml_collections import ConfigDict

from configs.common import (
    checkpoint_block,
    mesh_block,
    parallel_block,
    precision_block,
    train_block,
)

VARIANTS = ("tiny", "tiny_tfrecord", "wikitext", "wikitext_packed", "base", "large", "mlperf_v07")

# The MLPerf reference's preprocessed data (data.format=mlperf_tfrecord): point
# data.data_dir at the folder holding them (docs/official-inputs.md).
REFERENCE_TRAIN_FILES = ("part-*-of-00500",)
REFERENCE_EVAL_FILES = ("eval_10k",)
FIXTURE_DIR = "tests/fixtures/bert_tfrecord"


def _base() -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "bert"
    c.variant = ""
    c.seed = 0
    # One-hot einsums instead of gathers for embedding lookups and masked positions:
    # the TPU choice (MXU-friendly, no gather/scatter in the step).
    c.einsum_gather = True

    c.model = ConfigDict(
        dict(
            vocab_size=0,  # 0: taken from the vocabulary file
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            mlp_dim=3072,
            max_position=512,
            type_vocab_size=2,
            dropout_rate=0.1,
            # Attention scores and softmax in "float32" or "bfloat16" (half the bytes of
            # the [B, H, L, L] tensors; docs/performance.md "TPU step time").
            attention_softmax_dtype="float32",
            # Divide by the softmax's sum after the product with the values (Google's
            # v0.7 BERT): the same outputs up to rounding, less work over [B, H, L, L].
            attention_normalize_after_values=False,
            # On CPU, the attention core in blocks of examples whose [B, H, L, L] scores
            # fit this many bytes (docs/design.md "Attention in blocks on CPU");
            # 0 keeps it whole. TPU and GPU programs ignore it.
            attention_cpu_block_bytes=512 * 1024,
            # Stack the layers on a `stack` axis and lax.scan them: one layer's program
            # whatever the depth (what makes BERT-large compile for a multipod).
            # Changes the parameter tree: checkpoints of one form do not restore into
            # the other.
            scan_layers=False,
            scan_unroll=1,  # layers per scan iteration; 0: the whole stack, no loop
            remat=False,  # recompute layer activations in the backward pass
            # What remat keeps: "nothing", "dots" or "dots_no_batch" (mlperf/bert/model.py).
            remat_policy="nothing",
            # GELU's tanh approximation (Google's TF BERT, the MLPerf reference checkpoint)
            # instead of the exact erf GELU (Hugging Face's "gelu").
            gelu_approximate=False,
            # The eval's vocabulary projection in this many groups of the eval batch, each
            # reduced before the next is made (CPU caches); 1: one pass. Divides it.
            eval_head_chunks=1,
            # The training loss's masked-LM head a vocabulary slice of this many columns at
            # a time (CPU caches; one more matmul); 0: the whole logits (the TPU form).
            train_head_vocab_slice=0,
            # Its matmuls' operand dtype ("": precision.compute_dtype); fp32 accumulation.
            train_head_dtype="",
            # The last encoder layer only at the rows the heads read ([CLS] and the
            # masked-LM positions); the same outputs, a fraction of that layer's work.
            last_layer_head_positions_only=False,
        )
    )
    c.data = ConfigDict(
        dict(
            # "text": examples made from plain-text corpora (cached array_record);
            # "mlperf_tfrecord": the MLPerf reference's preprocessed TFRecords, read in
            # place (train_files / eval_files are glob patterns of TFRecord files).
            format="text",
            corpus="files",  # "stdlib" (embedded) or "files"
            train_files=(),
            eval_files=(),
            data_dir="",  # relative train/eval/vocab paths are resolved against this
            vocab_file="",
            vocab_size=30522,
            lowercase=True,
            cache_dir="",  # "" = ~/.cache/multipod
            seq_length=128,
            max_predictions=20,
            masked_lm_prob=0.15,
            dupe_factor=5,
            short_seq_prob=0.1,
            seed=12345,
            eval_fraction=0.05,
            max_eval_examples=0,
            input_workers=0,  # grain worker processes per host (0: read in-process)
            # Threads per process reading records ahead (grain's ReadOptions.num_threads,
            # 16 by default); 0: each record is read when its batch is made.
            read_threads=16,
            # Sequence packing (input_pipeline/bert_packing.py, docs/official-inputs.md):
            # up to `max_sequences` examples per row, attention within each; the batch
            # size counts rows, the MLPerf log's samples count sequences. max_predictions:
            # masked-LM slots per row (0: the example's plus max_sequences - 1); carry:
            # examples that may wait for the next batch before a batch is done.
            packing=ConfigDict(dict(enabled=False, max_sequences=3, max_predictions=0, carry=16)),
        )
    )
    c.mesh = mesh_block()
    c.parallel = parallel_block(rules=())
    c.precision = precision_block()
    c.optimizer = ConfigDict(
        dict(
            name="lamb",
            learning_rate=1e-3,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            weight_decay=0.01,
            warmup_steps=100,
            decay_steps=0,  # 0: train.steps
            power=1.0,
            grad_clip_norm=0.0,
        )
    )
    # MLPerf round whose rules apply: the target default (train.target=-1) and the
    # eval schedule of train.eval_every_samples=-1 (mlperf/bert/rules.py).
    c.mlperf = ConfigDict(dict(round="0.7"))
    # target: masked-LM accuracy; -1 = the round's (0.712 in v0.7, 0.720 from v1.0 on).
    c.train = train_block(target=-1.0)
    # Two-phase pretraining (Lin et al.): phase 2 at a longer sequence, switched once
    # `start_samples` training samples have been seen.
    c.phase2 = ConfigDict(
        dict(
            enabled=False,
            start_samples=0,
            seq_length=512,
            max_predictions=76,
            global_batch_size=256,
            learning_rate=1e-3,
            warmup_steps=0,
            steps=0,
        )
    )
    # Checkpoints (mlperf/checkpoint/): written asynchronously into `dir` ("" = the
    # workdir's checkpoints/) every `every_steps` steps (0: never), after each eval
    # (`at_eval`) and on SIGTERM; the last `keep` plus the `keep_best` best by the target
    # metric are kept. A restart with the same command resumes from the newest readable one.
    c.checkpoint = checkpoint_block()
    # Initial parameters from a pretrained BERT (docs/pretrained-checkpoints.md): a TF1
    # checkpoint prefix (the MLPerf reference model.ckpt-28252, with bert_config.json
    # beside it) or a Hugging Face BertForPreTraining directory; "" = random init.
    c.init = ConfigDict(dict(checkpoint=""))
    return c


def get_config(arg: str = "tiny") -> ConfigDict:
    """Returns the config for one variant."""
    if arg not in VARIANTS:
        raise ValueError(f"unknown bert variant {arg!r}; choose one of {VARIANTS}.")
    if arg == "wikitext_packed":
        c = get_config("wikitext")
        c.variant = arg
        # 1.51 sequences per packed row on this data (docs/results/bert-packing.md): 42
        # rows hold about wikitext's 64 sequences a step, so its schedule and eval
        # interval (in sequences) carry over.
        c.data.packing.enabled = True
        c.train.global_batch_size = 42
        return c
    c = _base()
    c.variant = arg
    if arg == "tiny":
        c.model.update(
            hidden_size=128,
            num_layers=2,
            num_heads=4,
            mlp_dim=512,
            max_position=64,
            dropout_rate=0.0,
        )
        c.data.update(
            corpus="stdlib",
            vocab_file="",
            vocab_size=2048,
            seq_length=32,
            max_predictions=5,
            dupe_factor=2,
            eval_fraction=0.05,
            max_eval_examples=1024,
        )
        c.mesh.ici_shape = (2, 4)
        c.precision.compute_dtype = "float32"
        c.optimizer.update(learning_rate=1e-2, warmup_steps=50, weight_decay=0.01)
        # Measured: 0.125 is reached after ~450-600 steps (~2 min on 2 cores), about
        # 2.3x the unigram baseline (0.055 at step 50); see the README's results table.
        c.train.update(
            global_batch_size=64,
            steps=1000,
            eval_every_samples=64 * 50,
            eval_batch_size=256,
            log_every_steps=50,
            target=0.125,
        )
    elif arg == "wikitext":
        # Hidden 128 reaches the target in less time than 192 or 256: it needs 400 steps
        # to 256's 300, at 1.7x the step rate (docs/benchmarks.md, the width sweep).
        c.model.update(
            hidden_size=128,
            num_layers=2,
            num_heads=4,
            mlp_dim=512,
            max_position=64,
            dropout_rate=0.0,
            # 32 groups of 8 examples (80 rows of 30,522 logits, 9.8 MB: within the L3
            # cache) make the eval pass 1.58x faster than one pass (docs/performance.md).
            eval_head_chunks=32,
            # The training loss's head in slices of 2,048 vocabulary columns, whose
            # [640, 2048] logits stay in cache, with bfloat16 matmul operands (the CPU's
            # AVX-512 BF16 dot; fp32 accumulation and softmax): the step runs 1.2x faster
            # than the whole fp32 logits (docs/design.md).
            train_head_vocab_slice=2048,
            train_head_dtype="bfloat16",
            # The last layer at [CLS] and the 10 masked positions only (11 of 64 rows):
            # the step runs 1.2x faster, the same outputs (docs/design.md).
            last_layer_head_positions_only=True,
        )
        c.data.update(
            corpus="files",
            train_files=("wikitext2_valid_test/valid.txt", "tinyshakespeare/input.txt"),
            eval_files=("wikitext2_valid_test/test.txt",),
            vocab_file="bert_base_uncased_vocab/vocab.txt",
            seq_length=64,
            max_predictions=10,
            dupe_factor=2,
            max_eval_examples=2048,
            # Each record read when its batch is made: grain's 16 reader threads cost the
            # train step on 2 cores more than they overlap (docs/design.md).
            read_threads=0,
        )
        # The one-hot embedding einsum over 30,522 ids costs more than the rest of this
        # small model on a CPU; gathers are the CPU choice (einsum stays the TPU one).
        c.einsum_gather = False
        # One device: on a 2-core CPU it runs this model 1.65x faster than eight fake
        # ones (docs/performance.md, "One CPU device"); the global batch is unchanged.
        c.mesh.ici_shape = (-1, 1)
        c.mesh.num_devices = 1
        c.precision.compute_dtype = "float32"
        # Measured alternatives (docs/benchmarks.md): other learning rates, warmups,
        # decays, batch sizes and AdamW reach 0.13 no sooner.
        c.optimizer.update(learning_rate=1e-2, warmup_steps=50)
        c.train.update(
            global_batch_size=64,
            steps=900,
            eval_every_samples=64 * 100,
            eval_batch_size=256,
            log_every_steps=50,
            # Measured: 0.1239 at step 300, 0.1343 at step 400 (about 2.2 min on 2 cores).
            target=0.13,
        )
    elif arg == "tiny_tfrecord":
        # The tiny model on the committed reference-format TFRecord fixture (tests).
        c.model.update(
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            mlp_dim=128,
            max_position=32,
            dropout_rate=0.0,
        )
        c.data.update(
            format="mlperf_tfrecord",
            data_dir=FIXTURE_DIR,
            train_files=("part-*-of-00004",),
            eval_files=("eval_tiny",),
            vocab_size=128,
            seq_length=32,
            max_predictions=5,
        )
        c.mesh.ici_shape = (2, 4)
        c.precision.compute_dtype = "float32"
        c.optimizer.update(learning_rate=1e-2, warmup_steps=4)
        c.train.update(
            global_batch_size=16,
            steps=12,
            eval_every_samples=16 * 6,
            eval_batch_size=16,
            log_every_steps=6,
        )
    elif arg in ("base", "large", "mlperf_v07"):
        # The reference's preprocessed TFRecords, evaluated as the rules prescribe.
        c.data.update(
            format="mlperf_tfrecord",
            train_files=REFERENCE_TRAIN_FILES,
            eval_files=REFERENCE_EVAL_FILES,
            seq_length=512,
            max_predictions=76,
        )
        c.train.eval_every_samples = -1
    if arg == "base":
        c.mesh.ici_shape = (-1, 1)
    elif arg in ("large", "mlperf_v07"):
        c.model.update(
            hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096, scan_layers=True
        )
        c.mesh.ici_shape = (-1, 4)
        if arg == "mlperf_v07":
            # Google's MLPerf v0.7 JAX BERT run (4096 TPU-v3 chips).
            c.optimizer.update(
                name="lamb",
                learning_rate=2.88293e-3,
                b1=0.88,
                b2=0.88,
                eps=1e-6,
                weight_decay=0.0166629,
                warmup_steps=287,
                decay_steps=560,
            )
            c.train.update(global_batch_size=8192, steps=560, eval_batch_size=8192)
            # Ten steps per host dispatch: the host's work per step measured under 5% of
            # the estimated TPU step on v3, v4 and v5p (docs/results/input-per-host.md).
            c.train.steps_per_dispatch = 10
            # Step time (docs/performance.md "TPU step time"): the layers' parameters stay
            # stacked (one leaf per kind: few, large updates and collectives), but the
            # scan is unrolled whole (scan_unroll=0), so no loop stores each layer's
            # [B, H, L, L] softmax, dropout masks and probabilities in stacked buffers
            # and nothing is recomputed: the compiler's estimate drops from 55.9 ms
            # (looped, remat) to 43.9 ms at v3:64x64, in 1.8 of the 16 GiB per core.
            # Gradients are summed over `data` in bfloat16, as Google's v0.7 run did.
            # Neither changes the model or the optimizer.
            c.model.scan_unroll = 0
            c.parallel.grad_reduce_dtype = "bfloat16"
            # Attention divided by the softmax's sum after the product with the values,
            # as Google's v0.7 BERT: the same outputs, less work over [B, H, L, L].
            c.model.attention_normalize_after_values = True
            # The 30,522-word vocabulary padded to a multiple of 64 so the embedding and
            # MLM head split over a model axis of up to 64 (as TPU implementations do).
            c.model.vocab_size = 30528
            # The reference checkpoint's activation (Google's TF BERT `gelu`).
            c.model.gelu_approximate = True
            # For launch.plan: the step budget of Google's published run (its logs reach
            # the target at step 496 in 9 of 10 runs: `launch.report --published`).
            c.plan = ConfigDict(dict(steps_to_target=560))
    return c

"""BERT pretraining configs: `--config configs/bert.py:<variant>`.

Variants: tiny (embedded stdlib-docstring corpus, CPU, minutes; `make run`),
wikitext (WikiText-2 + tiny-shakespeare with the real bert-base-uncased vocab),
base, large, mlperf_v07 (Google's MLPerf v0.7 JAX run: BERT-large, GBS 8192, LAMB).
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

VARIANTS = ("tiny", "wikitext", "base", "large", "mlperf_v07")


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
            # Stack the layers on a `stack` axis and lax.scan them: one layer's program
            # whatever the depth (what makes BERT-large compile for a multipod).
            # Changes the parameter tree: checkpoints of one form do not restore into
            # the other.
            scan_layers=False,
            scan_unroll=1,  # layers per scan iteration
            remat=False,  # recompute layer activations in the backward pass
        )
    )
    c.data = ConfigDict(
        dict(
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
        )
    )
    c.mesh = mesh_block()
    c.parallel = parallel_block()
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
    c.train = train_block(target=0.712)  # masked-LM accuracy (MLPerf v0.7)
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
    return c


def get_config(arg: str = "tiny") -> ConfigDict:
    """Returns the config for one variant."""
    if arg not in VARIANTS:
        raise ValueError(f"unknown bert variant {arg!r}; choose one of {VARIANTS}.")
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
        c.model.update(
            hidden_size=256,
            num_layers=2,
            num_heads=4,
            mlp_dim=1024,
            max_position=64,
            dropout_rate=0.0,
        )
        c.data.update(
            corpus="files",
            data_dir="../shared/data",
            train_files=("wikitext2_valid_test/valid.txt", "tinyshakespeare/input.txt"),
            eval_files=("wikitext2_valid_test/test.txt",),
            vocab_file="bert_base_uncased_vocab/vocab.txt",
            seq_length=64,
            max_predictions=10,
            dupe_factor=2,
            max_eval_examples=2048,
        )
        # The one-hot embedding einsum over 30,522 ids costs more than the rest of this
        # small model on a CPU; gathers are the CPU choice (einsum stays the TPU one).
        c.einsum_gather = False
        c.mesh.ici_shape = (-1, 1)
        c.precision.compute_dtype = "float32"
        c.optimizer.update(learning_rate=1e-2, warmup_steps=50)
        c.train.update(
            global_batch_size=64,
            steps=900,
            eval_every_samples=64 * 100,
            eval_batch_size=256,
            log_every_steps=50,
            # Measured: 0.1226 at step 300, 0.1347 at step 400 (~8 min on 2 cores).
            target=0.13,
        )
    elif arg == "base":
        c.mesh.ici_shape = (-1, 1)
    elif arg in ("large", "mlperf_v07"):
        c.model.update(
            hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096, scan_layers=True
        )
        c.data.update(seq_length=512, max_predictions=76)
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
            c.train.update(
                global_batch_size=8192,
                steps=560,
                eval_every_samples=0,
                eval_batch_size=8192,
                target=0.712,
            )
            # The 30,522-word vocabulary padded to a multiple of 64 so the embedding and
            # MLM head split over a model axis of up to 64 (as TPU implementations do).
            c.model.vocab_size = 30528
            # For launch.plan: steps to the target in Google's published run.
            c.plan = ConfigDict(dict(steps_to_target=560))
    return c

"""Transformer translation configs: `--config configs/transformer.py:<variant>`.

Variants: tiny (embedded English -> German task, CPU, minutes; `make quality`),
multi30k (Multi30k En-De, `multi30k/` under data.data_dir; `make quality-real`), base, big,
tiny_tfrecord (the tiny model on the committed reference-format TFRecord fixture),
mlperf_v07 (Google's MLPerf v0.7 JAX run: big model, 2048 packed 256-token rows, Adam,
target BLEU 25.0 (the reference's uncased BLEU) on the reference's preprocessed WMT
TFRecords; point data.data_dir at them).
Any value can be overridden: `--config.train.global_batch_size=64`.
"""

from ml_collections import ConfigDict

from configs.common import (
    checkpoint_block,
    mesh_block,
    parallel_block,
    precision_block,
    train_block,
)

VARIANTS = ("tiny", "tiny_tfrecord", "multi30k", "base", "big", "mlperf_v07")
# The reference's preprocessed WMT En-De (data.format=mlperf_tfrecord), as t2t writes the
# packed problem the TPU submissions trained on; point data.data_dir at the folder.
WMT_TFRECORD_FILES = dict(
    train_files=("translate_ende_wmt32k_packed-train-*",),
    eval_files=("translate_ende_wmt32k-dev-*",),
    vocab_file="vocab.translate_ende_wmt32k.32768.subwords",
)
FIXTURE_DIR = "tests/fixtures/wmt_tfrecord"


def _base() -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "transformer"
    c.variant = ""
    c.seed = 0
    # One-hot einsums for embedding lookups and the label pick: no gather/scatter in the
    # train step (the TPU choice); gathers are faster for big vocabularies on CPU.
    c.einsum_gather = True
    c.label_smoothing = 0.1
    c.model = ConfigDict(
        dict(
            emb_dim=1024,
            num_heads=16,
            num_layers=6,
            mlp_dim=4096,
            dropout_rate=0.1,
            attention_dropout_rate=0.1,
            # On CPU, the attention core in blocks of examples whose [B, H, Q, K] scores
            # fit this many bytes (docs/design.md "Attention in blocks on CPU");
            # 0 keeps it whole. TPU and GPU programs ignore it.
            attention_cpu_block_bytes=512 * 1024,
            # Each stack's layers stacked and applied with lax.scan (fewer train-state
            # leaves for a dispatch to handle); scan_unroll layers per iteration, 0: the
            # whole stack unrolled, no loop.
            scan_layers=False,
            scan_unroll=1,
        )
    )
    c.data = ConfigDict(
        dict(
            # "text": line-aligned parallel text (corpus below), tokenised here;
            # "mlperf_tfrecord": the MLPerf reference's preprocessed TFRecords (subword ids;
            # train_files / eval_files are glob patterns, vocab_file its subword vocabulary;
            # input_pipeline/translation_tfrecord.py, docs/official-inputs.md).
            format="text",
            corpus="files",  # "tiny" (embedded) or "files"
            data_dir="",  # relative file paths are resolved against this
            train_files=("train.en", "train.de"),  # (source, target), line-aligned
            eval_files=("newstest2014.en", "newstest2014.de"),
            # mlperf_tfrecord only: (source, reference) text files to evaluate on instead of
            # eval_files, as the reference scores newstest2014 (sources encoded with the
            # subword vocabulary, BLEU against the reference lines as they are).
            eval_text_files=(),
            vocab_file="",  # sentencepiece model; "" = train one on the training text
            vocab_size=32768,
            vocab_type="unigram",  # sentencepiece model type: unigram, bpe or word
            max_length=256,  # packed row length; longer train pairs are skipped
            eval_max_length=256,  # longer eval inputs are truncated
            pack=True,
            seed=0,  # packing order and the tiny corpus
            cache_dir="",  # "" = ~/.cache/multipod
            max_eval_examples=0,
            tiny_train_pairs=6000,
            tiny_eval_pairs=256,
        )
    )
    # final_sets: name -> (source, target) files decoded in full once after training
    # (mlperf/transformer/final_bleu.py; launch.final_bleu for a finished run); the in-loop
    # eval uses data.max_eval_examples.
    # bleu: "sacrebleu" (13a tokenisation, cased) or "mlperf_v07" (the v0.7 reference's
    # target: uncased, its own tokenizer; mlperf/transformer/bleu_mlperf.py).
    c.eval = ConfigDict(
        dict(
            beam_size=4,
            length_penalty=0.6,
            max_extra_length=50,
            final_sets={},
            bleu="sacrebleu",
        )
    )
    c.mesh = mesh_block()
    c.parallel = parallel_block()
    c.precision = precision_block()
    c.checkpoint = checkpoint_block()
    c.optimizer = ConfigDict(
        dict(
            name="adam",
            # "rsqrt": linear warmup then 1/sqrt(step) (mlperf/transformer/schedule.py;
            # peak learning_rate / sqrt(warmup_steps) [/ sqrt(rsqrt_hidden)]), taken by the
            # loop through TransformerTask.schedule(); "linear": the loop's own linear
            # warmup + polynomial decay to 0 over decay_steps (short CPU runs).
            schedule="rsqrt",
            rsqrt_hidden=0,  # > 0: also scale by 1/sqrt(hidden)
            learning_rate=0.0625,  # rsqrt: peak 0.0625 / sqrt(1000) = 2e-3
            b1=0.9,
            b2=0.98,
            eps=1e-9,
            weight_decay=0.0,
            warmup_steps=1000,
            decay_steps=0,  # 0: train.steps
            power=1.0,
            grad_clip_norm=0.0,
        )
    )
    # target: BLEU (sacrebleu, 0-100); logged as eval_accuracy = BLEU / 100
    c.train = train_block(steps=10000, log_every_steps=50, target=25.0)
    return c


def get_config(arg: str = "tiny") -> ConfigDict:
    """Returns the config for one variant."""
    if arg not in VARIANTS:
        raise ValueError(f"unknown transformer variant {arg!r}; choose one of {VARIANTS}.")
    c = _base()
    c.variant = arg
    if arg in ("tiny", "tiny_tfrecord"):
        c.model.update(
            emb_dim=64,
            num_heads=4,
            num_layers=2,
            mlp_dim=256,
            dropout_rate=0.0,
            attention_dropout_rate=0.0,
        )
        c.data.update(
            corpus="tiny",
            vocab_size=128,
            vocab_type="word",
            max_length=64,
            eval_max_length=64,
            seed=0,
        )
        c.mesh.ici_shape = (2, 4)
        c.precision.compute_dtype = "float32"
        c.data.tiny_eval_pairs = 128
        c.optimizer.update(schedule="linear", learning_rate=3e-3, warmup_steps=50)
        # Measured (this config, 128 eval pairs): BLEU 0.0 / 1.4 / 5.2 / 31.3 / 77.3 / 89.9
        # at steps 50 / 100 / 150 / 200 / 250 / 300 (token accuracy 0.98 at 300); 100.0
        # by step 300 in a 500-step run. The target sits past the steep part of the curve.
        c.train.update(
            global_batch_size=32,
            steps=600,
            eval_every_samples=32 * 50,
            eval_batch_size=128,
            log_every_steps=50,
            target=80.0,
        )
    if arg == "tiny_tfrecord":
        # The tiny model on the committed reference-format TFRecord fixture (tests).
        c.data.update(
            format="mlperf_tfrecord",
            data_dir=FIXTURE_DIR,
            max_length=48,
            eval_max_length=48,
            **WMT_TFRECORD_FILES,
        )
        c.eval.bleu = "mlperf_v07"
        c.train.update(eval_every_samples=32 * 20, steps=40, target=80.0)
    elif arg == "multi30k":
        # Sized to reach BLEU 25 well inside 30 minutes on 2 CPU cores: a narrow model (the
        # tied output projection over 4,000 ids is then the largest matmul) on one device,
        # ~4.5 epochs of Multi30k to the target; docs/benchmarks.md has the measured run.
        c.model.update(
            emb_dim=128,
            num_heads=4,
            num_layers=3,
            mlp_dim=512,
            dropout_rate=0.1,
            attention_dropout_rate=0.0,
        )
        c.data.update(
            corpus="files",
            train_files=("multi30k/train.en", "multi30k/train.de"),
            eval_files=("multi30k/val.en", "multi30k/val.de"),
            vocab_size=4000,
            max_length=64,
            eval_max_length=128,
            # In-loop BLEU on a fixed subset, the first 256 lines of val.*, so that beam
            # search stays a small part of the run; every line of val.* and
            # test_2016_flickr.* is decoded once after training (eval.final_sets).
            max_eval_examples=256,
        )
        c.eval.final_sets = ConfigDict(
            {
                "val": ("multi30k/val.en", "multi30k/val.de"),
                "test_2016_flickr": (
                    "multi30k/test_2016_flickr.en",
                    "multi30k/test_2016_flickr.de",
                ),
            }
        )
        # The one-hot lookups over 4,000 ids cost more than this small model on a CPU.
        c.einsum_gather = False
        # One device: on 2 cores a little faster than eight fake ones (59.7 against 56.0
        # rows/s at GBS 64; docs/benchmarks.md); the global batch is unchanged by it.
        c.mesh.ici_shape = (-1, 1)
        c.mesh.num_devices = 1
        c.precision.compute_dtype = "float32"
        c.optimizer.update(schedule="linear", learning_rate=3e-3, warmup_steps=150)
        c.train.update(
            global_batch_size=64,
            # ~1 s per step alone on 2 cores; the target came at step 600 (11 minutes).
            steps=1600,
            eval_every_samples=64 * 200,
            eval_batch_size=128,
            log_every_steps=50,
            target=25.0,
        )
    elif arg == "base":
        c.model.update(emb_dim=512, num_heads=8, num_layers=6, mlp_dim=2048)
    elif arg in ("big", "mlperf_v07"):
        c.mesh.ici_shape = (-1, 4)
        if arg == "mlperf_v07":
            # Google's MLPerf v0.7 JAX Transformer run (4096 TPU-v3 chips, 15.5 s).
            c.optimizer.update(
                b1=0.9086575725261137,
                b2=0.9198719118104947,
                eps=1e-9,
                learning_rate=3.3092157691415953,
                warmup_steps=664,
                rsqrt_hidden=1024,
            )
            # Stacked layers, unrolled whole: the program of the layer loop, a train state
            # of 108 leaves instead of 558 for each dispatch to handle.
            c.model.update(scan_layers=True, scan_unroll=0)
            c.train.update(
                global_batch_size=2048,
                steps=2000,
                # The reference's eval is one batch of 2 rows per replica (2048 replicas:
                # 4096 rows hold newstest2014's 3003 sentences); it splits over data=2048.
                eval_batch_size=4096,
                target=25.0,
                # 50 steps per host dispatch (one per progress line): the state's
                # dispatch paid once per 50 steps (docs/results/input-per-host.md).
                steps_per_dispatch=50,
            )
            c.data.update(
                format="mlperf_tfrecord",
                max_length=256,
                vocab_size=33708,
                eval_text_files=("newstest2014.en", "newstest2014.de"),
                **WMT_TFRECORD_FILES,
            )
            # The reference's target is its uncased BLEU (bleu_mlperf.py), not SacreBLEU.
            c.eval.bleu = "mlperf_v07"
            # For launch.plan and the TPU table: steps to the target in Google's published
            # v0.7 logs (BLEU 25 after 4-5 epochs of 276.5 steps: 1,106-1,383; midpoint).
            c.plan = ConfigDict(dict(steps_to_target=1245))
    return c

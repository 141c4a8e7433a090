"""BERT encoders scaled past the MLPerf sizes, for planning: `configs/bert_scale.py:<size>`.

Sizes (parameters of the encoder stack, 12 x layers x hidden^2, plus embeddings):
10b (hidden 4096, 48 layers, 9.7B), 100b (hidden 12288, 64 layers, 116B), 1t (hidden
32768, 80 layers, 1.03T). Heads are 128 wide (32, 96 and 256 of them: tensor parallelism
must divide the heads, so 256-way splits need the 1t model) and the MLP is 4 x hidden,
as in BERT. Each is the `mlperf_v07` BERT run (data format, LAMB, bfloat16 compute) with
what a model this size needs: scanned layers with rematerialisation, FSDP (parameters,
gradients and optimizer state sharded over `data`) and tensor parallelism over `model`
(the default degree divides the heads and the padded vocabulary) with sequence
parallelism (the residual stream's rows over `model` too). These configs are for
`launch.inspect` and `launch.plan` on TPU slices; nothing here has been trained.
"""

from configs.bert import get_config as bert_config

# hidden size, layers, default tensor-parallel degree
SIZES = {
    "10b": (4096, 48, 8),
    "100b": (12288, 64, 16),
    "1t": (32768, 80, 64),
}
HEAD_DIM = 128


def get_config(arg: str):
    """Returns the config for one size."""
    if arg not in SIZES:
        raise ValueError(f"unknown bert_scale size {arg!r}; choose one of {tuple(SIZES)}.")
    hidden, layers, model_parallel = SIZES[arg]
    c = bert_config("mlperf_v07")
    c.variant = f"scale_{arg}"
    c.model.update(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=hidden // HEAD_DIM,
        mlp_dim=4 * hidden,
        scan_layers=True,
        # A loop of one layer per iteration, rematerialised: `mlperf_v07` unrolls its 24
        # layers whole (scan_unroll=0), which at 48-80 layers of these widths multiplies
        # the compile's time and host memory (the 100b v5p:16x16x16 compile: 16.1 GB
        # resident unrolled). The planner's estimate of a loop extrapolates 1- and
        # 2-layer compiles (docs/aot-and-planning.md).
        scan_unroll=1,
        remat=True,
        remat_policy="dots_no_batch",
    )
    if arg == "1t":
        # The 30,522-word vocabulary padded to a multiple of 256 (mlperf_v07 pads to 64),
        # so the embedding and MLM head split over a model axis of up to 256.
        c.model.vocab_size = 30720
    c.parallel.fsdp = True
    # Sequence parallelism: the residual stream's rows split over `model` as well, so
    # the layer norms, dropout and residual adds are not repeated on every tensor-parallel
    # device (docs/design.md "Sequence parallelism": 1.50x for 10b, 1.17x for 100b
    # by the compiler's estimate).
    c.parallel.rules = (("residual_length", "model"),)
    c.mesh.ici_shape = (-1, model_parallel)
    # 4096 sequences of 512 tokens (2M tokens) per step: a batch that splits over the
    # data axis of every 4096-chip candidate; eval at the same batch.
    c.train.update(global_batch_size=4096, eval_batch_size=4096)
    c.plan.steps_to_target = 0  # no published run: the config's step budget
    return c

"""Collective and gather/scatter counting on HLO text."""

from parallel.aot import hlo_op_stats

HLO = """
ENTRY %main {
  %p0 = f32[16,32]{1,0} parameter(0)
  %all-reduce.1 = f32[16,32]{1,0} all-reduce(%p0), replica_groups={{0,1}}, to_apply=%add
  %reduce-scatter.2 = bf16[8,32]{1,0} reduce-scatter(%p0), dimensions={0}, to_apply=%add
  %ags = (f32[8,32]{1,0}, f32[16,32]{1,0}) all-gather-start(%reduce-scatter.2), dimensions={0}
  %agd = f32[16,32]{1,0} all-gather-done(%ags)
  %g = f32[4,32]{1,0} gather(%p0, %idx), offset_dims={1}
  ROOT %s = f32[16,32]{1,0} scatter(%p0, %idx, %upd), to_apply=%add
}
"""


def test_counts_collectives_once_per_async_pair_with_result_bytes():
    stats = hlo_op_stats(HLO)
    assert stats["collectives"]["all-reduce"] == 1
    assert stats["collectives"]["reduce-scatter"] == 1
    assert stats["collectives"]["all-gather"] == 1
    assert stats["collectives"]["all-to-all"] == 0
    assert stats["collective_bytes"]["all-reduce"] == 16 * 32 * 4
    assert stats["collective_bytes"]["reduce-scatter"] == 8 * 32 * 2
    assert stats["collective_bytes"]["all-gather"] == 16 * 32 * 4
    assert stats["gather_scatter"] == 2


def test_replica_group_sizes_in_every_printed_form():
    from parallel.hlo_text import replica_group_size

    assert replica_group_size("all-reduce(%x), replica_groups={{0,4,8},{1,5,9}}, to") == 3
    assert replica_group_size("all-gather(%x), replica_groups=[8,4]<=[32], dim") == 4
    text = (
        "all-reduce(%x), replica_groups=mesh['axis_0'=8,'axis_1'=4,'axis_2'=2] {'axis_0','axis_2'}"  # noqa: E501
    )
    assert replica_group_size(text) == 16
    # libtpu also prints a device order between the mesh and the named axes.
    text = "all-reduce(%x), replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0','axis_1'}, use"  # noqa: E501
    assert replica_group_size(text) == 8
    assert replica_group_size("collective-permute(%x), source_target_pairs={{0,1}}") == 1


def test_wire_bytes_follow_the_ring_algorithm():
    from parallel.hlo_text import wire_bytes

    assert wire_bytes("all-reduce", 1000, 4) == 1500  # 2 (g-1)/g n
    assert wire_bytes("all-gather", 1000, 4) == 750  # (g-1)/g of the gathered result
    assert wire_bytes("reduce-scatter", 250, 4) == 750  # (g-1) shards of 250
    assert wire_bytes("collective-permute", 64, 1) == 64
    stats = hlo_op_stats(HLO)
    assert stats["collective_wire_bytes"]["all-reduce"] == 16 * 32 * 4  # 2 x 1/2 x n


# What the TPU compiler makes of weight-update sharding's reduce-scatters (libtpu,
# v3:2x2): its reduce-scatter-decomposer pass rewrites most of them as an all-reduce of
# the whole gradient, combined with others into one tuple all-reduce, and fuses each
# device's dynamic-slice of it into the update. Shapes and layouts as libtpu prints them.
SLICED_HLO = """
%fused_slice (param_0: f32[64,128], param_1: u32[]) -> f32[16,128] {
  %param_0 = f32[64,128]{1,0:T(8,128)} parameter(0)
  %param_1 = u32[]{:T(256)S(6)} parameter(1)
  %zero = u32[]{:T(256)} constant(0)
  ROOT %dynamic-slice.2 = f32[16,128]{1,0:T(8,128)} dynamic-slice(%param_0, %param_1, %zero), dynamic_slice_sizes={16,128}
}

ENTRY %main (p: f32[64,128], q: f32[512], r: f32[8], v: f32[32,8], w: f32[32]) -> f32[] {
  %p = f32[64,128]{1,0:T(8,128)} parameter(0)
  %q = f32[512]{0:T(512)} parameter(1)
  %r = f32[8]{0:T(256)} parameter(2)
  %v = f32[32,8]{1,0:T(8,128)} parameter(3)
  %w = f32[32]{0:T(256)} parameter(4)
  %off = u32[]{:T(256)S(6)} parameter(5)
  %all-reduce.323 = (f32[64,128]{1,0:T(8,128)}, f32[512]{0:T(512)}, f32[8]{0:T(256)}) all-reduce(%p, %q, %r), channel_id=3, replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true, to_apply=%add
  %gte.0 = f32[64,128]{1,0:T(8,128)} get-tuple-element(%all-reduce.323), index=0
  %gte.1 = f32[512]{0:T(512)} get-tuple-element(%all-reduce.323), index=1
  %gte.2 = f32[8]{0:T(256)} get-tuple-element(%all-reduce.323), index=2
  %fusion.1 = f32[16,128]{1,0:T(8,128)} fusion(%gte.0, %off), kind=kLoop, calls=%fused_slice
  %slice.1 = f32[64]{0:T(256)} dynamic-slice(%gte.1, %off), dynamic_slice_sizes={64}
  %norm = f32[]{:T(256)} reduce(%gte.2, %zero), dimensions={0}, to_apply=%add
  %all-reduce.1 = f32[32,8]{1,0:T(8,128)} all-reduce(%v), channel_id=4, replica_groups=[2,4]<=[8], to_apply=%add
  %slice.2 = f32[8,8]{1,0:T(8,128)} dynamic-slice(%all-reduce.1, %off, %zero), dynamic_slice_sizes={8,8}
  %ars = f32[32]{0:T(256)} all-reduce-start(%w), channel_id=5, replica_groups=[2,4]<=[8], to_apply=%add
  %ard = f32[32]{0:T(256)} all-reduce-done(%ars)
  %slice.3 = f32[8]{0:T(256)} dynamic-slice(%ard, %off), dynamic_slice_sizes={8}
  %half = f32[16]{0:T(256)} dynamic-slice(%ard, %off), dynamic_slice_sizes={16}
  ROOT %t = (f32[16,128], f32[64], f32[], f32[8,8], f32[8], f32[16]) tuple(%fusion.1, %slice.1, %norm, %slice.2, %slice.3, %half)
}
"""  # noqa: E501


def test_all_reduce_read_through_a_dynamic_slice_counts_as_a_reduce_scatter():
    stats = hlo_op_stats(SLICED_HLO)
    assert stats["collectives"]["reduce-scatter"] == 0
    assert stats["collectives"]["all-reduce"] == 3  # still on the wire as all-reduces
    # The fused [16,128] slice and the [64] slice of the combined all-reduce (1/8 of 512
    # over a group of 4: the model shard of a model-replicated bias), and [8,8] of [32,8]
    # over a group of 4. Not: the [8] read whole by a reduce (a real all-reduce), nor the
    # async [32] read both as 1/4 and as a half (the half needs the whole sum).
    assert stats["reduce_scatter_as_all_reduce"] == 3
    assert stats["reduce_scatter_as_all_reduce_bytes"] == (16 * 128 + 64 + 8 * 8) * 4


def test_an_async_all_reduce_read_only_through_a_slice_counts_too():
    text = SLICED_HLO.replace(", %half)", ")").replace(
        "  %half = f32[16]{0:T(256)} dynamic-slice(%ard, %off), dynamic_slice_sizes={16}\n", ""
    )
    assert "%half" not in text
    assert hlo_op_stats(text)["reduce_scatter_as_all_reduce"] == 4


# A TPU-style loop (no known_trip_count): `i < 5` with i starting at 1 runs 4 times.
LOOP_HLO = """
%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} constant({...})
  %d = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,16]) tuple(%n, %d)
}

%cond (q: (s32[], f32[8,16])) -> pred[] {
  %q = (s32[], f32[8,16]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %five = s32[] constant(5)
  ROOT %lt = pred[] compare(%j, %five), direction=LT
}

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %start = s32[] constant(1)
  %init = (s32[], f32[8,16]) tuple(%start, %a)
  %loop = (s32[], f32[8,16]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_loop_flops_multiply_the_body_by_the_induction_variable_trip_count():
    from parallel.hlo_counts import hlo_flops

    dot = 2 * 8 * 16 * 16
    assert hlo_flops(LOOP_HLO, matmul_only=True) == 4 * dot
    assert hlo_flops(LOOP_HLO) == 4 * (dot + 1)  # + the counter's add


# A bidirectional windowed einsum as libtpu emits it: `i < 8` stepping by 2 runs 4 times,
# each iteration a dot and a collective permute of its half-chunk.
STEPPED_LOOP_HLO = (
    LOOP_HLO.replace("%one = s32[] constant(1)", "%one = s32[] constant(2)")
    .replace("%five = s32[] constant(5)", "%five = s32[] constant(8)")
    .replace("%start = s32[] constant(1)", "%start = s32[] constant(0)")
    .replace(
        "ROOT %t = (s32[], f32[8,16]) tuple(%n, %d)",
        "%cp = f32[8,16]{1,0} collective-permute(%d), source_target_pairs={{0,1},{1,0}}\n"
        "  ROOT %t = (s32[], f32[8,16]) tuple(%n, %cp)",
    )
)


def test_a_loop_stepping_by_two_runs_half_the_bound_and_its_permutes_count_per_trip():
    """The trip count reads the induction variable's step (counting `i < 8` as 8 trips
    doubled a 100B BERT's FLOPs on 4096 chips), and wire bytes count every trip."""
    from parallel.aot import hlo_op_stats
    from parallel.hlo_counts import hlo_flops, hlo_wire_bytes

    dot = 2 * 8 * 16 * 16
    assert hlo_flops(STEPPED_LOOP_HLO, matmul_only=True) == 4 * dot
    once = sum(hlo_op_stats(STEPPED_LOOP_HLO)["collective_wire_bytes"].values())
    assert once == 8 * 16 * 4  # one permute of an f32[8,16], seen once
    assert hlo_wire_bytes(STEPPED_LOOP_HLO) == 4 * once
    assert hlo_wire_bytes(STEPPED_LOOP_HLO, loops_once=True) == once
    assert hlo_wire_bytes(LOOP_HLO) == 0.0


def test_scan_flops_equal_the_unrolled_count():
    import jax
    import jax.numpy as jnp

    from parallel.aot import compiled_stats

    def scanned(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0].sum()

    def unrolled(w, x):
        for i in range(w.shape[0]):
            x = jnp.tanh(x @ w[i])
        return x.sum()

    w, x = jnp.ones((6, 64, 64)), jnp.ones((32, 64))
    stats = {}
    for fn in (scanned, unrolled):
        # Gradients for w and x: the unrolled program then needs every layer's dx too.
        compiled = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(w, x).compile()
        assert "while" in compiled.as_text() or fn is unrolled
        stats[fn.__name__] = compiled_stats(compiled)
    s, u = stats["scanned"], stats["unrolled"]
    assert s["matmul_flops"] == u["matmul_flops"] == 3 * 6 * 2 * 32 * 64 * 64
    assert abs(s["flops"] / u["flops"] - 1) < 0.05  # elementwise glue differs slightly
    assert abs(u["flops"] / u["flops_cost_analysis"] - 1) < 0.05  # agrees with XLA's count
    assert s["flops_cost_analysis"] < s["flops"] / 3  # XLA sees the scan body once


def test_max_pool_gradient_counts_no_scatter_in_the_program():
    """A max-pool's gradient is `select-and-scatter`: no scatter as written (TPUs run it
    natively), but the CPU compiler expands it into one. Inspect counts the program."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from parallel.aot import compiled_stats, program_gather_scatter

    def pooled(x):
        return nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2)).sum()

    lowered = jax.jit(jax.grad(pooled)).lower(jnp.ones((2, 8, 8, 3)))
    assert "select-and-scatter" in lowered.as_text(dialect="hlo")
    assert program_gather_scatter(lowered) == 0
    stats = compiled_stats(lowered.compile(), lowered)
    assert stats["gather_scatter"] == 0
    # What the CPU backend made of it (seen by the count on the compiled step).
    assert stats["gather_scatter_compiled"] >= 1


# A batched dot as libtpu rewrites it (Mask R-CNN's einsum RoIAlign at 256 px, v3:4x4):
# the batch dimensions become windows over a base-dilated input, so only 1 tap in 2
# (dim 0) and 1 in 512 (dim 1) reads a real element.
BASE_DILATED_HLO = """
%fused (param_0: bf16[2,8,256,512,7], param_1: bf16[2,512,7,8,1]) -> bf16[2,512,256,7,7] {
  %param_0 = bf16[2,8,256,512,7]{2,1,4,3,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[2,512,7,8,1]{2,3,4,1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution-base-dilated.137 = bf16[2,512,256,7,7]{2,4,3,1,0:T(8,128)(2,1)} convolution(%param_0, %param_1), window={size=2x512x1 stride=1x511x1 lhs_dilate=2x512x1}, dim_labels=0fb12_01oi2->01b2f
}

ENTRY %main (a: bf16[2,8,256,512,7], b: bf16[2,512,7,8,1]) -> bf16[2,512,256,7,7] {
  %a = bf16[2,8,256,512,7]{2,1,4,3,0} parameter(0)
  %b = bf16[2,512,7,8,1]{2,3,4,1,0} parameter(1)
  ROOT %f = bf16[2,512,256,7,7]{2,4,3,1,0} fusion(%a, %b), kind=kOutput, calls=%fused
}
"""  # noqa: E501


def test_convolution_flops_skip_taps_on_dilation_holes_and_padding():
    from parallel.hlo_counts import hlo_flops

    # batch 256 x out features 7 x in features 8 x real (position, tap) pairs: 2 of 4
    # in dim 0, 512 of 512x512 in dim 1, 7 in dim 2.
    assert hlo_flops(BASE_DILATED_HLO, matmul_only=True) == 2 * 256 * 7 * 8 * (2 * 512 * 7)


def test_strided_padded_and_transposed_convolution_flops_match_xla():
    import jax
    import jax.numpy as jnp

    from parallel.aot import compiled_stats

    def convs(x, w):
        y = jax.lax.conv_general_dilated(x, w, (2, 2), ((1, 1), (1, 1)))  # strided, padded
        return jax.lax.conv_general_dilated(  # transposed: base-dilated input
            y, w, (1, 1), ((2, 2), (2, 2)), lhs_dilation=(2, 2)
        ).sum()

    x, w = jnp.ones((2, 8, 15, 15)), jnp.ones((8, 8, 3, 3))
    stats = compiled_stats(jax.jit(jax.grad(convs, argnums=(0, 1))).lower(x, w).compile())
    assert abs(stats["flops"] / stats["flops_cost_analysis"] - 1) < 0.05


# One all-gather as libtpu (v5e) emits it when it interleaves the transfer with compute:
# a chain of three fusions (start, continuation, done), each holding a copy of the
# all-gather with the full result shape, the same channel_id and a chain_id; the loop
# runs it 4 times.
_LINK = """
%link_{n} (param_0.{n}: bf16[64,32], param_1.{n}: bf16[64,128]) -> bf16[64,128] {{
  %param_0.{n} = bf16[64,32]{{1,0:T(8,128)(2,1)}} parameter(0)
  %param_1.{n} = bf16[64,128]{{1,0:T(8,128)(2,1)}} parameter(1)
  ROOT %all-gather.{n} = bf16[64,128]{{1,0:T(8,128)(2,1)}} all-gather(%param_0.{n}), channel_id=43, replica_groups=[4,4]<=[16], dimensions={{1}}, use_global_device_ids=true, frontend_attributes={{chain_id="3"}}
}}
"""  # noqa: E501
CHAIN_LOOP_HLO = "".join(_LINK.format(n=n) for n in range(3)) + LOOP_HLO.replace(
    "ROOT %t = (s32[], f32[8,16]) tuple(%n, %d)",
    "%s = bf16[64,32]{1,0} constant({...})\n"
    "  %f0 = bf16[64,128]{1,0} fusion(%s, %s), kind=kOutput, calls=%link_0\n"
    "  %f1 = bf16[64,128]{1,0} fusion(%s, %f0), kind=kOutput, calls=%link_1\n"
    "  %f2 = bf16[64,128]{1,0} fusion(%s, %f1), kind=kOutput, calls=%link_2\n"
    "  ROOT %t = (s32[], f32[8,16]) tuple(%n, %d)",
)


def test_a_collective_split_into_a_chain_of_fusions_counts_once():
    """libtpu's v5e programs split large all-gathers into chains; counting every link
    with the full shape counted BERT-large's activation gathers 2.6x over on v5e."""
    from parallel.hlo_counts import hlo_wire_bytes
    from parallel.hlo_text import chain_links

    assert chain_links(CHAIN_LOOP_HLO) == {("43", "3"): 3}
    stats = hlo_op_stats(CHAIN_LOOP_HLO)
    assert stats["collectives"]["all-gather"] == 1
    assert stats["collective_bytes"]["all-gather"] == 64 * 128 * 2
    once = 3 / 4 * 64 * 128 * 2  # (g - 1) / g of the gathered result, g = 4
    assert stats["collective_wire_bytes"]["all-gather"] == once
    assert hlo_wire_bytes(CHAIN_LOOP_HLO) == 4 * once  # once per trip, not 3 times
    assert hlo_wire_bytes(CHAIN_LOOP_HLO, loops_once=True) == once

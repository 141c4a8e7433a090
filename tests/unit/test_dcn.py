"""parallel/dcn.py: replica groups in every form XLA prints, and which collectives cross
slices, on hand-written HLO lines (8 devices, slices 0 0 0 0 1 1 1 1)."""

from __future__ import annotations

import pytest

from parallel.dcn import dcn_collectives, replica_groups

SLICES = [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("replica_groups={{0,2},{1,3}}", [[0, 2], [1, 3]]),
        ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("replica_groups=mesh['a'=2,'b'=4] {'a'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("replica_groups=mesh['a'=2,'b'=4] {'b'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("source_target_pairs={{0,4},{4,0}}", [[0, 4], [4, 0]]),
        ("replica_groups={}", [list(range(8))]),
    ],
)
def test_replica_groups_in_every_form(text, groups):
    assert replica_groups(f"%x = f32[8]{{0}} all-reduce(f32[8]{{0}} %p), {text}", 8) == groups


def test_only_groups_spanning_slices_count_and_the_slow_hop_is_shared():
    hlo = "\n".join(
        [
            # Inside each slice: not DCN.
            "  %a = f32[1024]{0} all-reduce(f32[1024]{0} %p), replica_groups=[2,4]<=[8]",
            # Across slices, one device per slice per group: 2 (2-1)/2 x 4096 B = 4096 B.
            "  %b = f32[1024]{0} all-reduce(f32[1024]{0} %q), replica_groups=[4,2]<=[2,4]T(1,0)",
            # All 8 devices (4 per slice): the slow hop carries a quarter, 1024 B.
            "  %c = f32[1024]{0} all-reduce(f32[1024]{0} %r), replica_groups={}",
            "  %d = bf16[16]{0} collective-permute(bf16[16]{0} %s), source_target_pairs={{0,1}}",
        ]
    )
    out = dcn_collectives(hlo, SLICES)
    assert out["dcn_collectives"] == {"all-reduce": 2}
    assert out["dcn_collective_bytes"] == {"all-reduce": 8192}
    assert out["dcn_wire_bytes"] == pytest.approx(4096 + 1024)


def test_megascale_host_transfers_are_the_dcn_part():
    """How libtpu compiles a multi-slice program: the DCN part of each collective is a
    `send` host transfer to the megascale runtime, its operand what this device sends
    (lines as the v5e:2x2 x 2 slices compile prints them, attributes shortened)."""
    attrs = '_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_transfer_type='
    hlo = "\n".join(
        [
            f'  %send = (f32[1024]{{0}}, u32[], token[]) send(%a, %t), {attrs}"ALL_REDUCE"}}',
            f'  %recv = (f32[1024]{{0}}, u32[], token[]) recv(%t), {attrs}"ALL_REDUCE"}}',
            f'  %send.1 = (f32[2048]{{0}}, u32[], token[]) send(%b, %t), {attrs}"REDUCE_SCATTER"}}',
            f'  %send.2 = (bf16[512]{{0}}, u32[], token[]) send(%c, %t), {attrs}"ALL_GATHER"}}',
            "  %send-done = token[] send-done(%send), is_host_transfer=true",
            # An ICI collective inside each slice (partitions 0-3 are one slice here).
            "  %d = f32[64]{0} all-reduce(f32[64]{0} %p), replica_groups={{0,1,2,3}}",
        ]
    )
    out = dcn_collectives(hlo, [0, 0, 0, 0, 1, 1, 1, 1])
    assert out["dcn_collectives"] == {"all-reduce": 1, "reduce-scatter": 1, "all-gather": 1}
    assert out["dcn_collective_bytes"] == {
        "all-reduce": 4096,
        "reduce-scatter": 8192,
        "all-gather": 1024,
    }
    # Two slices: all-reduce 2 (1/2) 4096 + reduce-scatter (1/2) 8192 + all-gather 1 x 1024.
    assert out["dcn_wire_bytes"] == pytest.approx(4096 + 4096 + 1024)


def test_a_chained_collective_crossing_slices_counts_once():
    """The links of a chained all-gather (libtpu v5e: same channel_id and chain_id, each
    with the full result shape) send its bytes once."""
    link = (
        "  %all-gather.{n} = bf16[64,128]{{1,0}} all-gather(%p.{n}), channel_id=43, "
        "replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{1}}, "
        'frontend_attributes={{chain_id="3"}}\n'
    )
    text = "".join(link.format(n=n) for n in range(3))
    out = dcn_collectives(text, SLICES)  # groups {0,2,4,6}, {1,3,5,7}: two per slice
    assert out["dcn_collectives"] == {"all-gather": 1}
    assert out["dcn_collective_bytes"] == {"all-gather": 64 * 128 * 2}
    assert out["dcn_wire_bytes"] == pytest.approx(1 / 2 * 64 * 128 * 2 / 2)

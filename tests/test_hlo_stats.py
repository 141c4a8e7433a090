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

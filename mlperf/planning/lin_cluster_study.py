"""Lin et al.'s cluster study regenerated from the model: `launch.plan --lin_cluster_study`.

Lin et al., "Multi-node BERT pretraining: cost-efficient approach" (arXiv 2008.00177,
2020) pretrain BERT-large on 32 nodes x 8 NVIDIA T4 joined by 10 Gb/s Ethernet with
gradient accumulation and fp16 gradients, two phases (sequence 128, then 512), and
report about 70% weak-scaling efficiency and 12 days to pretrain. This module predicts
the same quantities from `parallel.costmodel.cluster_step_time` and a reference TPU
compile of each phase (FLOPs and HBM bytes per example and per step,
`reports.reference_costs`), and the cost of buying the cluster against renting it
(`parallel.hardware` prices). Every input is in `LIN_CLUSTER_STUDY`, printed with the table.
"""

from __future__ import annotations

import copy
from typing import Any

# The paper's published figures (nothing else here is published by it).
LIN_PUBLISHED = {
    "weak_scaling_efficiency": 0.70,
    "pretrain_days": 12.0,
    "source": "Lin et al. 2020 (arXiv 2008.00177): ~70% weak scaling, 12 days",
}
# The study's inputs. `micro`, `grad_reduce_dtype`, the phases' sequence lengths and the
# cluster are the paper's stated setup; the rest are this planner's assumptions, named as
# such in the printed table.
LIN_CLUSTER_STUDY: dict[str, Any] = {
    "cluster": "t4x8x32-10gbe",  # the paper's: 32 nodes x 8 T4, 10 Gb/s Ethernet
    "nodes": (1, 8, 32),
    "micro": 4,  # the paper's gradient accumulation steps
    "grad_reduce_dtype": "float16",  # the paper's fp16 gradients
    # Examples per phase: the LAMB recipe (You et al. 2019: 7,038 steps x 65,536 at
    # sequence 128, then 1,563 x 32,768 at 512), an assumption: the paper's own sample
    # count is not recorded here. Examples per T4 per microbatch: assumed (4,096 tokens).
    "phases": (
        {
            "seq_length": 128,
            "max_predictions": 20,
            "batch_per_device": 32,
            "examples": 7038 * 65536,
        },
        {"seq_length": 512, "max_predictions": 80, "batch_per_device": 8, "examples": 1563 * 32768},
    ),  # fmt: skip
    # An 8-slot PCIe server with a 10 GbE NIC, without GPUs: an assumed price, not a
    # sourced one; replace it with a quote.
    "host_price_usd": 10000.0,
}


def phase_config(config, phase: dict[str, Any]):
    """A copy of `config` at one phase's sequence length and masked positions."""
    c = copy.deepcopy(config)
    c.data.update(seq_length=phase["seq_length"], max_predictions=phase["max_predictions"])
    c.model.max_position = max(int(c.model.max_position), phase["seq_length"])
    return c


def lin_cluster_study(
    config=None, study: dict[str, Any] | None = None, costs: list[dict] | None = None
) -> dict[str, Any]:
    """Weak scaling at the study's node counts for each phase, time to pretrain on the
    whole cluster, and buy vs rent. `config` defaults to BERT-large; `costs` (one
    `reference_costs` dict per phase, as returned under "costs") skips the compiles."""
    from configs.bert import get_config
    from mlperf.planning.reports import cluster_scaling, reference_costs
    from parallel.hardware import CHIPS, CLUSTERS, PURCHASE_PRICES

    study = study or LIN_CLUSTER_STUDY
    config = config if config is not None else get_config("large")
    cluster = CLUSTERS[study["cluster"]]
    phases_out, all_costs, seconds = [], [], 0.0
    for i, phase in enumerate(study["phases"]):
        c = phase_config(config, phase)
        phase_costs = costs[i] if costs else reference_costs(c)
        all_costs.append(phase_costs)
        rows = cluster_scaling(
            c,
            study["cluster"],
            phase["batch_per_device"],
            study["micro"],
            costs=phase_costs,
            grad_reduce_dtype=study["grad_reduce_dtype"],
            nodes=tuple(study["nodes"]),
        )
        full = rows[-1]
        phase_s = phase["examples"] / full["samples_per_s"]
        seconds += phase_s
        global_batch = full["devices"] * phase["batch_per_device"] * study["micro"]
        phases_out.append(
            {**phase, "global_batch": global_batch, "seconds": phase_s, "scaling": rows}
        )
    chip_key = cluster.chip
    card, card_date, card_source = PURCHASE_PRICES[chip_key]
    rent_per_hour = cluster.devices * CHIPS[chip_key].price_per_hour
    buy = cluster.devices * card + cluster.nodes * study["host_price_usd"]
    hours = seconds / 3600
    return {
        "study": study,
        "published": LIN_PUBLISHED,
        "costs": all_costs,
        "phases": phases_out,
        "pretrain_s": seconds,
        "pretrain_days": seconds / 86400,
        "rent_usd": rent_per_hour * hours,
        "rent_per_hour_usd": rent_per_hour,
        "rent_price": (CHIPS[chip_key].price_per_hour, CHIPS[chip_key].price_date),
        "buy_usd": buy,
        "card_price": (card, card_date, card_source),
        "break_even_runs": buy / (rent_per_hour * hours),
        "break_even_days": buy / rent_per_hour / 24,
    }


def lin_cluster_study_text(r: dict[str, Any]) -> str:
    """The study as markdown: weak scaling per phase, time and cost, and the inputs."""
    s, pub = r["study"], r["published"]
    nodes = [n for n in s["nodes"]]
    head = " | ".join(f"{n} node{'s' if n > 1 else ''}" for n in nodes)
    lines = [
        f"Weak-scaling efficiency (throughput per T4 against one T4), {s['micro']} "
        f"accumulation steps, {s['grad_reduce_dtype']} gradients:",
        "",
        f"| phase | 1 T4 | {head} | published (Lin et al.) |",
        "|---|" + "---|" * (len(nodes) + 2),
    ]
    for p in r["phases"]:
        effs = " | ".join(f"{row['weak_scaling_efficiency']:.0%}" for row in p["scaling"][1:])
        lines.append(
            f"| seq {p['seq_length']}, {p['batch_per_device']}/T4 x {s['micro']} | 100% | "
            f"{effs} | ~{pub['weak_scaling_efficiency']:.0%} (published) |"
        )
    lines += ["", "Step on the whole cluster (seconds):", ""]
    lines += ["| phase | global batch | compute | HBM | in node | between nodes | step |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for p in r["phases"]:
        f = p["scaling"][-1]
        lines.append(
            f"| seq {p['seq_length']} | {p['global_batch']} | {f['compute_s']:.3f} | "
            f"{f['memory_s']:.3f} | {f['intra_node_s']:.3f} | {f['inter_node_s']:.3f} | "
            f"{f['step_s']:.3f} |"
        )
    card, card_date, card_source = r["card_price"]
    price, price_date = r["rent_price"]
    phase_days = ", ".join(
        f"seq {p['seq_length']}: {p['seconds'] / 86400:.2f} d" for p in r["phases"]
    )
    lines += [
        "",
        "| | predicted | published (Lin et al.) |",
        "|---|---|---|",
        f"| time to pretrain BERT-large | {r['pretrain_days']:.1f} days ({phase_days}) | "
        f"{pub['pretrain_days']:g} days |",
        f"| rent ({price:.2f} $/T4-h, GPU only, {price_date}) | ${r['rent_usd']:,.0f} per "
        f"pretraining (${r['rent_per_hour_usd']:,.0f}/h) | not recorded here |",
        f"| buy (cards + hosts) | ${r['buy_usd']:,.0f} | not recorded here |",
        f"| buying pays off after | {r['break_even_runs']:.1f} pretrainings "
        f"({r['break_even_days']:.0f} days of use; power and upkeep not counted) | |",
        "",
        "Assumptions:",
        f"- cluster: {s['cluster']} (parallel/hardware.py CLUSTERS); peaks as published, "
        "no overlap of compute and communication",
        f"- Lin et al.'s setup: {s['micro']} accumulation steps, {s['grad_reduce_dtype']} "
        "gradient all-reduce, phases at sequence "
        + " and ".join(str(p["seq_length"]) for p in s["phases"]),
        "- examples per phase (LAMB recipe, assumed): "
        + ", ".join(f"{p['examples']:,}" for p in s["phases"]),
        "- examples per T4 per microbatch (assumed): "
        + ", ".join(str(p["batch_per_device"]) for p in s["phases"]),
        f"- T4 card ${card:,.0f} ({card_date}, {card_source}); host without GPUs "
        f"${s['host_price_usd']:,.0f} (assumed, not sourced)",
        "- FLOPs and HBM bytes per example and per step: BERT compiled on v3:2x2 at 1 and 2 "
        "examples per core, per phase: "
        + "; ".join(
            f"seq {p['seq_length']}: {c['flops_per_example']:.3g} FLOP + "
            f"{c['bytes_per_example'] / 1e9:.3g} GB per example, "
            f"{c['bytes_per_step'] / 1e9:.3g} GB per step"
            for p, c in zip(s["phases"], r["costs"], strict=True)
        ),
        f"- published: {pub['source']}",
    ]
    return "\n".join(lines)

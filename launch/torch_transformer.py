"""Our Transformer's PyTorch peer: `torch.nn.Transformer` (pre-LN, ReLU) with one embedding
shared by source, target and the output projection, and sinusoidal positions.

The peers benchmark (launch/bench/peers.py) trains it beside ours; `launch.export
--format torch` writes a Transformer run's weights under its names (the mapping is
mlperf/transformer/torch_export.py). One sentence pair per row: segments and packing
are ours only (padding is a key-padding mask here).
"""

from __future__ import annotations

import math

import torch


class TorchTransformer(torch.nn.Module):
    """core (torch.nn.Transformer) + embed (the shared table); forward gives logits."""

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int,
        num_heads: int,
        num_layers: int,
        mlp_dim: int,
        dropout_rate: float = 0.0,
        layer_norm_eps: float = 1e-6,  # ours (mlperf/transformer/model.py)
    ):
        super().__init__()
        self.emb_dim = emb_dim
        self.core = torch.nn.Transformer(
            d_model=emb_dim,
            nhead=num_heads,
            num_encoder_layers=num_layers,
            num_decoder_layers=num_layers,
            dim_feedforward=mlp_dim,
            dropout=dropout_rate,
            activation="relu",
            layer_norm_eps=layer_norm_eps,
            batch_first=True,
            norm_first=True,
        )
        self.embed = torch.nn.Embedding(vocab_size, emb_dim)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # as ours: small tied logits at init
        half = emb_dim // 2
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(half) / max(half - 1, 1))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def embed_at(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Scaled token embeddings plus the sinusoids of the positions ([sin | cos])."""
        angles = positions.float()[..., None] * self.inv_freq
        pos = torch.cat([torch.sin(angles), torch.cos(angles)], -1)
        return self.embed(tokens) * math.sqrt(self.emb_dim) + pos

    def forward(
        self,
        inputs: torch.Tensor,
        inputs_position: torch.Tensor,
        inputs_segmentation: torch.Tensor,
        targets: torch.Tensor,
        targets_position: torch.Tensor,
        targets_segmentation: torch.Tensor,
    ) -> torch.Tensor:
        """Teacher-forced logits [B, T, V] of padded pairs (segment 0 = padding)."""
        shifted = torch.nn.functional.pad(targets, (1, 0))[:, :-1]
        decoder_in = torch.where(targets_position == 0, torch.zeros_like(shifted), shifted)
        length = targets.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)  # True: not seen
        src_pad, tgt_pad = inputs_segmentation == 0, targets_segmentation == 0
        y = self.core(
            self.embed_at(inputs, inputs_position),
            self.embed_at(decoder_in, targets_position),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return y @ self.embed.weight.T

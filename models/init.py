"""OLMo's "mitchell" initialisation (the paper's LM init, ``model.init: mitchell``).

Every matrix is drawn from a normal truncated at ±3σ with σ = 1/√fan_in; the output
projections of attention and MLP are further scaled by 1/√(2(layer+1)). Embeddings and the
head use σ = 1/√d_model. (OLMo's ``init_weights``; the paper's configs set ``init_fn:
mitchell``.)
"""

from __future__ import annotations

import math

import torch
from torch import nn


def mitchell_stds(model: nn.Module) -> dict[str, float]:
    """σ per weight-bearing module path of a TransformerLM."""
    d = model.cfg.d_model
    stds = {"embed": 1 / math.sqrt(d), "head": 1 / math.sqrt(d)}
    for i, block in enumerate(model.blocks):
        depth_scale = 1 / math.sqrt(2 * (i + 1))
        stds[f"blocks.{i}.attn.qkv"] = 1 / math.sqrt(d)
        stds[f"blocks.{i}.attn.out"] = depth_scale / math.sqrt(d)
        stds[f"blocks.{i}.mlp.fc1"] = 1 / math.sqrt(d)
        stds[f"blocks.{i}.mlp.fc2"] = depth_scale / math.sqrt(block.mlp.fc2.in_features)
    return stds


@torch.no_grad()
def mitchell_init(model: nn.Module) -> None:
    """Re-initialise ``model``'s matrices in place per :func:`mitchell_stds`."""
    modules = dict(model.named_modules())
    for path, std in mitchell_stds(model).items():
        if path == "head" and model.cfg.tie_embeddings:
            continue  # shares the embedding matrix
        nn.init.trunc_normal_(modules[path].weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

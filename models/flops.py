"""Parameter and FLOP counts exactly as the paper counts them (torch-free)."""

from __future__ import annotations

import math


def lm_param_count(
    d_model: int,
    n_layers: int,
    vocab_size: int,
    *,
    mlp_ratio: int = 4,
    tie_embeddings: bool = False,
    swiglu: bool = False,
) -> int:
    """All parameters of the decoder LM, embeddings and head included.

    With the paper's defaults this is N = 12·L·d² + 2·V·d + (4L+1)·d: per layer 4d² of
    attention and 8d² of MLP (ratio 4), four d-vectors of LayerNorm weight (pre-attention,
    pre-MLP, Q-norm, K-norm), one final LayerNorm, and untied input/output embeddings.
    SwiGLU keeps the hidden width at ratio·d with three matrices instead of two.
    """
    mlp_mats = 3 if swiglu else 2
    per_layer = 4 * d_model * d_model + mlp_mats * mlp_ratio * d_model * d_model + 4 * d_model
    embeddings = (1 if tie_embeddings else 2) * vocab_size * d_model
    return n_layers * per_layer + embeddings + d_model


def proxy_param_count(
    width: int, depth: int, *, mlp_ratio: int = 4, swiglu: bool = False, layernorm: bool = True
) -> int:
    """Trainable parameters of the proxy student: per block fc1 (no bias, doubled for SwiGLU's
    gate), fc2 with bias and, with LayerNorm, its affine weight and bias."""
    hidden = mlp_ratio * width
    fc1 = (2 if swiglu else 1) * width * hidden
    per_block = fc1 + hidden * width + width + (2 * width if layernorm else 0)
    return depth * per_block


def lm_attention_flops_per_token(d_model: int, n_layers: int, seq_len: int) -> float:
    """Forward+backward FLOPs per token of QK^T and AV (causal mask not discounted)."""
    return 6.0 * 2.0 * n_layers * seq_len * d_model


def training_flops(n_params: int, tokens: int) -> float:
    """The paper's compute measure C = 6·N·D."""
    return 6.0 * n_params * tokens


def steps_for_budget(budget: float, n_params: int, tokens_per_step: int) -> int:
    """Optimizer steps that spend ``budget`` FLOPs at C = 6·N·D: floor(C / 6N / tokens_per_step)."""
    return math.floor(budget / (6.0 * n_params) / tokens_per_step)

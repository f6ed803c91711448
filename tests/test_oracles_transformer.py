"""The LM against an independent forward pass written out by hand (float64, fixed weights):
LayerNorm without bias, QK-LayerNorm over d_model, RoPE as complex rotations of the pairs
(i, i + head_dim/2), causal softmax attention, GELU MLP, final LayerNorm, untied head."""

from __future__ import annotations

import math

import torch

from models.config import LMConfig
from models.transformer import TransformerLM

CFG = LMConfig(d_model=32, n_layers=2, head_dim=8, vocab_size=40, seq_len=12)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight


def rope(x: torch.Tensor) -> torch.Tensor:
    """(T, H, hd): rotate the pair (x_i, x_{i+hd/2}) at position p by p·10000^(-2i/hd)."""
    seq, _, hd = x.shape
    half = hd // 2
    out = torch.empty_like(x)
    for p in range(seq):
        for i in range(half):
            angle = p * 10000.0 ** (-2.0 * i / hd)
            z = complex(1.0, 0.0) * torch.complex(x[p, :, i], x[p, :, i + half])
            z = z * complex(math.cos(angle), math.sin(angle))
            out[p, :, i], out[p, :, i + half] = z.real, z.imag
    return out


def attention(x: torch.Tensor, w: dict, prefix: str, n_heads: int) -> torch.Tensor:
    seq, d = x.shape
    hd = d // n_heads
    q, k, v = (x @ w[f"{prefix}.qkv.weight"].T).split(d, dim=-1)
    q = layer_norm(q, w[f"{prefix}.q_norm.weight"])
    k = layer_norm(k, w[f"{prefix}.k_norm.weight"])
    q, k, v = (t.reshape(seq, n_heads, hd) for t in (q, k, v))
    q, k = rope(q), rope(k)
    out = torch.zeros(seq, n_heads, hd, dtype=x.dtype)
    for h in range(n_heads):
        for t in range(seq):
            scores = torch.stack([q[t, h] @ k[s, h] for s in range(t + 1)]) / math.sqrt(hd)
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            out[t, h] = sum(weights[s] * v[s, h] for s in range(t + 1))
    return out.reshape(seq, d) @ w[f"{prefix}.out.weight"].T


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))


def reference_logits(tokens: torch.Tensor, w: dict, cfg: LMConfig) -> torch.Tensor:
    x = w["embed.weight"][tokens]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        x = x + attention(layer_norm(x, w[f"{b}.attn_norm.weight"]), w, f"{b}.attn", cfg.n_heads)
        h = layer_norm(x, w[f"{b}.mlp_norm.weight"]) @ w[f"{b}.mlp.fc1.weight"].T
        x = x + gelu(h) @ w[f"{b}.mlp.fc2.weight"].T
    return layer_norm(x, w["final_norm.weight"]) @ w["head.weight"].T


def fixed_weights(model: TransformerLM) -> dict[str, torch.Tensor]:
    """Deterministic, non-trivial weights (LayerNorm weights away from 1, larger matrices
    so attention is far from uniform), written into ``model``."""
    gen = torch.Generator().manual_seed(1234)
    weights = {}
    for name, param in model.named_parameters():
        if "norm" in name:
            value = 0.5 + torch.rand(param.shape, generator=gen, dtype=torch.float64)
        else:
            value = 0.3 * torch.randn(param.shape, generator=gen, dtype=torch.float64)
        weights[name] = value
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    return weights


def test_forward_matches_the_hand_written_reference():
    model = TransformerLM(CFG)
    assert CFG.n_heads == 4
    weights = fixed_weights(model)
    model = model.double()
    tokens = torch.tensor([[3, 17, 17, 0, 39, 8, 21, 5, 5, 12, 30, 1]])
    with torch.no_grad():
        got = model(tokens)[0]
    want = reference_logits(tokens[0], weights, CFG)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # Swapping the first two tokens leaves position 2 the same query over the same set of
    # keys: only RoPE can tell the orders apart.
    swapped = tokens.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    with torch.no_grad():
        other = model(swapped)[0]
    assert (other[2] - got[2]).abs().max() > 1e-3


def test_rope_changes_attention_scores_with_relative_position_only():
    # The reference rotation itself: q·k depends on the positions' difference only.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 8, generator=gen, dtype=torch.float64).expand(6, 1, 8).clone()
    k = torch.randn(1, 1, 8, generator=gen, dtype=torch.float64).expand(6, 1, 8).clone()
    rq, rk = rope(q), rope(k)
    dots = torch.tensor([[float(rq[a, 0] @ rk[b, 0]) for b in range(6)] for a in range(6)])
    assert torch.allclose(dots[2, 0], dots[5, 3]) and torch.allclose(dots[4, 4], dots[0, 0])
    assert not torch.allclose(dots[1, 0], dots[0, 0])

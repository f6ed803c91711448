"""Decoder-only transformer LM as the paper trained it (pre-LN, QK-LayerNorm, RoPE, GELU).

Only plain ``nn.Linear(bias=False)``, ``nn.LayerNorm(bias=False)`` and ``nn.GELU`` modules
carry the GEMMs and element-wise ops, so ``mx.apply`` can swap them for quantized twins
in place; attention itself goes through ``F.scaled_dot_product_attention`` (the paper did
not quantize QK^T or AV).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.config import LMConfig


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, ...]:
    """Cos/sin tables of shape (seq_len, head_dim) for rotate-half RoPE."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hd) queries or keys by position (in fp32 tables, returned in x's
    dtype so bf16 queries and keys stay bf16 like the values)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused QKV GEMM and LayerNorm on Q and K."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        # OLMo-style QK-norm acts on the full d_model width (one d-vector each for Q and K).
        self.q_norm = nn.LayerNorm(d, bias=False) if cfg.qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(d, bias=False) if cfg.qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (
            t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v)
        )
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, d))


class MLP(nn.Module):
    """GELU MLP (paper) or SwiGLU, hidden width mlp_ratio * d_model."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
        self.swiglu = cfg.mlp == "swiglu"
        self.fc1 = nn.Linear(d, 2 * hidden if self.swiglu else hidden, bias=False)
        self.act = nn.SiLU() if self.swiglu else nn.GELU()
        self.fc2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return self.fc2(self.act(gate) * up)
        return self.fc2(self.act(h))


class Block(nn.Module):
    """Pre-LN residual block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TransformerLM(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) for every matrix and embedding (or ``init: mitchell``, see
        models.init), ones for LayerNorm weights."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
        if self.cfg.init == "mitchell":
            from models.init import mitchell_init

            mitchell_init(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.cfg.seq_len:
            raise ValueError(f"sequence length {seq} exceeds model seq_len={self.cfg.seq_len}")
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.final_norm(x))

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of a (B, T+1) token batch."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def count_params(model: nn.Module) -> int:
    """Distinct trainable parameters (a tied embedding is counted once)."""
    return sum(p.numel() for p in model.parameters())

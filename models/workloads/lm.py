"""The decoder LM on token data (models.transformer, models.data)."""

from __future__ import annotations

import torch
from torch import nn

from models.config import RunSpec
from models.data import build_data
from models.flops import lm_attention_flops_per_token
from models.transformer import TransformerLM
from models.workloads import DataSource, register


class LanguageModel:
    """Next-token cross-entropy of a TransformerLM over the run's token data."""

    def build(self, spec: RunSpec, device: torch.device) -> tuple[nn.Module, DataSource]:
        return TransformerLM(spec.model), build_data(spec)

    def extra_flops(self, spec: RunSpec, tokens: int) -> float:
        m = spec.model
        return lm_attention_flops_per_token(m.d_model, m.n_layers, m.seq_len) * tokens


register("lm", LanguageModel())

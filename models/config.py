"""Run specification: everything one training run needs, as frozen pydantic models.

Torch-free so the sweep can expand and hash thousands of specs without importing torch.
The canonical JSON of a RunSpec (minus resources) is hashed into the run id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.flops import lm_param_count
from mx.spec import PrecisionSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LMConfig(_Frozen):
    """Decoder-only transformer shape and options (paper defaults)."""

    kind: Literal["lm"] = "lm"
    d_model: int = Field(gt=0)
    n_layers: int | None = Field(default=None, gt=0)
    head_dim: int = Field(default=64, gt=0)
    vocab_size: int = Field(default=32000, gt=1)
    seq_len: int = Field(default=512, gt=1)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: int = Field(default=4, gt=0)
    tie_embeddings: bool = False
    qk_norm: bool = True
    init_std: float = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _derive_layers(self) -> LMConfig:
        if self.d_model % self.head_dim:
            raise ValueError(
                f"d_model={self.d_model} is not a multiple of head_dim={self.head_dim}"
            )
        if self.n_layers is None:
            # The paper's ladder: n_layers = d_model / 64.
            object.__setattr__(self, "n_layers", max(1, self.d_model // 64))
        return self

    @property
    def n_heads(self) -> int:
        return self.d_model // self.head_dim

    def param_count(self) -> int:
        return lm_param_count(
            self.d_model,
            self.n_layers,
            self.vocab_size,
            mlp_ratio=self.mlp_ratio,
            tie_embeddings=self.tie_embeddings,
            swiglu=self.mlp == "swiglu",
        )


class SyntheticData(_Frozen):
    """Built-in corpus: a sparse order-k Markov source with an exactly known entropy rate."""

    kind: Literal["synthetic"] = "synthetic"
    # Order 1 by default: small models learn a V x branching table within a CPU-sized
    # budget, while order 2 (V² contexts) is mostly memorisation they cannot afford.
    order: int = Field(default=1, ge=1)
    branching: int = Field(default=8, ge=1)
    concentration: float = Field(default=0.5, gt=0)
    source_seed: int = 0


class TokenFileData(_Frozen):
    """Pre-tokenised uint16/uint32 memmap files (see README for the format)."""

    kind: Literal["tokens"] = "tokens"
    train: list[str]
    validation: list[str]
    dtype: Literal["uint16", "uint32"] = "uint16"


class TextFileData(_Frozen):
    """Small UTF-8 text files read as byte-level tokens (vocab 256)."""

    kind: Literal["text"] = "text"
    train: list[str]
    validation: list[str]


DataConfig = Annotated[SyntheticData | TokenFileData | TextFileData, Field(discriminator="kind")]


class TrainConfig(_Frozen):
    """Optimiser, schedule and logging (the paper's defaults)."""

    steps: int = Field(gt=0)
    batch_size: int = Field(default=512, gt=0)
    micro_batch_size: int | None = Field(default=None, gt=0)
    lr: float = Field(default=2e-4, gt=0)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-15
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_frac: float = Field(default=0.2, ge=0, le=1)
    warmup_init_frac: float = 0.1
    final_lr_frac: float = 0.1
    log_every: int = Field(default=10, gt=0)
    stats_every: int = Field(default=100, gt=0)
    eval_every: int | None = Field(default=None, gt=0)
    eval_batches: int = Field(default=4, gt=0)
    checkpoint_every: int | None = Field(default=None, gt=0)
    divergence_window: int = Field(default=50, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _micro_divides(self) -> TrainConfig:
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} must divide batch_size={self.batch_size}"
            )
        return self


class Resources(_Frozen):
    """What one run asks the scheduler for; not part of the run id."""

    cpus: int = Field(default=1, gt=0)
    gpus: int = Field(default=0, ge=0)
    nodes: int = Field(default=1, gt=0)
    time_min: int = Field(default=60, gt=0)
    mem_gb: float | None = Field(default=None, gt=0)


class RunSpec(_Frozen):
    """One fully resolved grid point."""

    model: LMConfig
    data: DataConfig = Field(default_factory=SyntheticData)
    train: TrainConfig
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    seed: int = 0
    budget: float | None = Field(default=None, gt=0)
    resources: Resources = Field(default_factory=Resources)
    tags: dict[str, str] = Field(default_factory=dict)

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.seq_len

    def hashed_json(self) -> str:
        """Canonical JSON of everything that determines the result (resources excluded)."""
        payload = self.model_dump(mode="json", exclude={"resources"})
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.hashed_json().encode()).hexdigest()[:12]

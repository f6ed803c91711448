"""Run specification: everything one training run needs, as frozen pydantic models.

Torch-free so the sweep can expand and hash thousands of specs without importing torch.
The canonical JSON of a RunSpec (minus resources) is hashed into the run id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from models.flops import lm_param_count, proxy_param_count, training_flops
from mx.spec import PrecisionSpec, check_format
from runfolder.label import config_label


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
    # "mitchell": OLMo's truncated normal, std 1/sqrt(fan_in), output projections / sqrt(2(l+1)).
    init: Literal["normal", "mitchell"] = "normal"

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

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def param_count(self) -> int:
        return lm_param_count(
            self.d_model,
            self.n_layers,
            self.vocab_size,
            mlp_ratio=self.mlp_ratio,
            tie_embeddings=self.tie_embeddings,
            swiglu=self.mlp == "swiglu",
        )


class ProxyConfig(_Frozen):
    """The paper's student-teacher proxy: a residual MLP student fits a frozen teacher.

    Student: ``depth`` blocks x <- x + fc2(act(fc1(LN(x)))), LN with affine weight and bias,
    fc1 d->ratio·d without bias, fc2 back to d with bias, no final LN. Teacher: the same
    depth of Linear->act->Linear without residual or LN, frozen, its default init scaled by
    ``teacher_init_scale`` (under default init its output variance is ~2e-4 at width 512,
    depth 4: the student mostly learns to cancel its identity path). Inputs are
    N(0, I_d); targets are teacher(x) plus ``noise_std`` Gaussian noise; the loss is MSE.
    ``paired`` also trains an FP32 twin from the same initial weights on the same batches,
    logging both losses and the gradient bias between the two.
    """

    kind: Literal["proxy"] = "proxy"
    depth: int = Field(default=4, gt=0)
    width: int = Field(default=512, gt=0)
    mlp_ratio: int = Field(default=4, gt=0)
    activation: Literal["gelu", "relu", "swiglu", "linear"] = "gelu"
    layernorm: bool = True
    teacher_init_scale: float = Field(default=1.0, gt=0)
    teacher_seed: int | None = None
    noise_std: float = Field(default=1e-3, ge=0)
    paired: bool = False
    # The paper's teacher: no biases, hidden width = width, and (teacher_precision: student)
    # targets computed through the student's MX ops during MX training, with fresh noise.
    teacher_bias: bool = True
    teacher_width: int | None = Field(default=None, gt=0)
    teacher_precision: Literal["fp32", "student"] = "fp32"

    @property
    def d_model(self) -> int:
        return self.width

    @property
    def n_layers(self) -> int:
        return self.depth

    @property
    def tokens_per_sample(self) -> int:
        return 1

    def param_count(self) -> int:
        return proxy_param_count(
            self.width,
            self.depth,
            mlp_ratio=self.mlp_ratio,
            swiglu=self.activation == "swiglu",
            layernorm=self.layernorm,
        )


def _model_kind(value: Any) -> str:
    # Grids written before the proxy existed have no ``kind``: they mean the LM.
    if isinstance(value, dict):
        return value.get("kind", "lm")
    return getattr(value, "kind", "lm")


ModelConfig = Annotated[
    Annotated[LMConfig, Tag("lm")] | Annotated[ProxyConfig, Tag("proxy")],
    Discriminator(_model_kind),
]


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


class LotionConfig(_Frozen):
    """LOTION's smoothing term ½·strength·Σ v̂_i σ_i² on the Linear weights (models.lotion)."""

    fmt: Literal["int4", "int8_pc"]
    strength: float = Field(default=1.0, gt=0)


class TrainConfig(_Frozen):
    """Optimiser, schedule and logging (the paper's defaults)."""

    steps: int = Field(gt=0)
    schedule: Literal["cosine", "constant"] = "cosine"
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
    # Checkpoints at multiples of this step count are kept for branching (interventions).
    keep_checkpoints_every: int | None = Field(default=None, gt=0)
    divergence_window: int = Field(default=50, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, gt=0)
    # Dtype policy (models.dtypes): autocast of the forward passes and the dtype the layers
    # see the (fp32 master) weights in; FP32 twins and the full_precision arm ignore both.
    autocast: Literal["auto", "bf16", "none"] = "auto"
    param_dtype: Literal["fp32", "bf16"] = "fp32"
    lotion: LotionConfig | None = None
    # Also evaluate the model with its Linear weights cast (RNE) to this format.
    quantized_eval: str | None = None

    @field_validator("quantized_eval")
    @classmethod
    def _known_eval_format(cls, value: str | None) -> str | None:
        return None if value is None else check_format(value)

    @model_validator(mode="after")
    def _lotion_evaluates_quantized(self) -> TrainConfig:
        if self.lotion is not None and self.quantized_eval is None:
            object.__setattr__(self, "quantized_eval", self.lotion.fmt)
        return self

    @model_validator(mode="after")
    def _micro_divides(self) -> TrainConfig:
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} must divide batch_size={self.batch_size}"
            )
        return self


class Resources(_Frozen):
    """What one run asks the scheduler for; not part of the run id.

    A run spans ``nodes`` x ``tasks_per_node`` processes (ranks) that split each global
    batch, so the layout changes speed and memory, never the loss trajectory. ``gpus`` and
    ``mem_gb`` are per node, ``cpus`` per rank; ``tasks_per_node`` defaults to one rank per
    GPU. ``strategy`` picks DDP (replicated weights) or FSDP (fully sharded); ``auto`` shards
    models too large to replicate comfortably (see models.distributed).
    """

    cpus: int = Field(default=1, gt=0)
    gpus: int = Field(default=0, ge=0)
    nodes: int = Field(default=1, gt=0)
    tasks_per_node: int | None = Field(default=None, gt=0)
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    time_min: int = Field(default=60, gt=0)
    mem_gb: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_rank_per_gpu(self) -> Resources:
        if self.tasks_per_node is None:
            object.__setattr__(self, "tasks_per_node", max(1, self.gpus))
        if self.gpus and self.gpus != self.tasks_per_node:
            raise ValueError(
                f"gpus={self.gpus} per node needs tasks_per_node={self.gpus} (one process per "
                f"GPU), got tasks_per_node={self.tasks_per_node}"
            )
        return self

    @property
    def world_size(self) -> int:
        """Processes the run trains on: nodes x tasks_per_node."""
        return self.nodes * self.tasks_per_node


class Branch(_Frozen):
    """Where a branched run starts: the parent run's state after ``step`` updates, continued
    under the precision intervention ``arm`` (see mx.arms). The parent lives in the same
    sweep folder."""

    parent: str = Field(min_length=1)
    step: int = Field(gt=0)
    arm: str = Field(min_length=1)


# Fields added after run ids were first handed out: omitted from the hash while they hold
# their default, so earlier specs keep their ids.
_HASH_OMIT_IF_DEFAULT = {
    ("train", "schedule"): "cosine",
    ("branch",): None,
    ("train", "autocast"): "auto",
    ("train", "param_dtype"): "fp32",
    ("model", "init"): "normal",
    ("model", "teacher_bias"): True,
    ("model", "teacher_width"): None,
    ("model", "teacher_precision"): "fp32",
    ("precision", "profile"): "ocp",
    ("precision", "pre_round"): "none",
    ("precision", "ln_bias_grad"): True,
    ("precision", "ln_internals"): "fp32",
    ("precision", "grad_rounding"): None,
    ("precision", "hadamard_wgrad"): False,
    ("precision", "keep_bf16"): [],
    ("precision", "nvfp4_weight_block"): "16x16",
    ("train", "lotion"): None,
    ("train", "quantized_eval"): None,
}
# Fields that cannot change a run's result.
_HASH_NEVER = (("train", "keep_checkpoints_every"),)


def _pop_path(payload: dict, path: tuple[str, ...], only_if: Any = ...) -> None:
    *parents, last = path
    for key in parents:
        payload = payload.get(key, {})
    if last in payload and (only_if is ... or payload[last] == only_if):
        del payload[last]


class RunSpec(_Frozen):
    """One fully resolved grid point."""

    model: ModelConfig
    data: DataConfig = Field(default_factory=SyntheticData)
    train: TrainConfig
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    seed: int = 0
    budget: float | None = Field(default=None, gt=0)
    resources: Resources = Field(default_factory=Resources)
    tags: dict[str, str] = Field(default_factory=dict)
    branch: Branch | None = None

    @model_validator(mode="after")
    def _proxy_owns_its_data(self) -> RunSpec:
        if self.model.kind == "proxy" and self.data != SyntheticData():
            raise ValueError(
                "proxy runs generate their own data (Gaussian inputs, teacher targets): "
                "remove the data section"
            )
        return self

    @model_validator(mode="after")
    def _splits_across_ranks(self) -> RunSpec:
        world = self.resources.world_size
        if world == 1:
            return self
        if isinstance(self.model, ProxyConfig) and self.model.paired:
            raise ValueError(
                f"a paired proxy run trains in one process; it asks for {world} "
                "(set resources.nodes and resources.tasks_per_node to 1)"
            )
        if self.branch is not None:
            raise ValueError(
                f"a branched run trains in one process; it asks for {world} "
                "(set resources.nodes and resources.tasks_per_node to 1)"
            )
        batch, micro = self.train.batch_size, self.train.micro_batch_size
        if batch % world:
            raise ValueError(
                f"train.batch_size={batch} must split evenly across the run's {world} "
                "processes (resources.nodes x resources.tasks_per_node)"
            )
        if micro and micro < batch // world and (batch // world) % micro:
            raise ValueError(
                f"train.micro_batch_size={micro} must divide the per-process batch "
                f"{batch // world} (batch_size={batch} over {world} processes)"
            )
        return self

    @property
    def label(self) -> str:
        """The configuration label (runfolder.label.config_label): tags.config, else the
        precision's name."""
        return config_label({"tags": self.tags, "precision": self.precision.model_dump()})

    @property
    def tokens_per_step(self) -> int:
        """Training samples per step times tokens per sample (1 for the proxy)."""
        return self.train.batch_size * self.model.tokens_per_sample

    @property
    def n_params(self) -> int:
        """N: the parameters of the model."""
        return self.model.param_count()

    @property
    def tokens(self) -> int:
        """D: the tokens the run trains on (steps x tokens per step)."""
        return self.train.steps * self.tokens_per_step

    @property
    def flops(self) -> float:
        """C = 6·N·D of the run as specified."""
        return training_flops(self.n_params, self.tokens)

    def resolve(self, steps: int | None = None) -> RunSpec:
        """This spec with what is derived from it filled in once: ``steps`` (when given: the
        budget's step count) and ``tags.config`` (its label). Not validated again: no
        validator depends on either (the spec was validated as a whole)."""
        train = self.train if steps is None else self.train.model_copy(update={"steps": steps})
        tags = {**self.tags, "config": self.label}
        return self.model_copy(update={"train": train, "tags": tags})

    def hashed_json(self) -> str:
        """Canonical JSON of everything that determines the result (resources excluded)."""
        payload = self.model_dump(mode="json", exclude={"resources"})
        for path, default in _HASH_OMIT_IF_DEFAULT.items():
            _pop_path(payload, path, default)
        for path in _HASH_NEVER:
            _pop_path(payload, path)
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.hashed_json().encode()).hexdigest()[:12]

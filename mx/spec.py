"""Precision specification for MX emulation (torch-free so configs load fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from runfolder.label import precision_label

MX_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
# NVIDIA's two-level format: E2M1 elements, 16-blocks, E4M3 block scale, FP32 tensor scale.
NV_FORMATS = ("nvfp4",)
# Per-channel symmetric integers (absmax scale per slice along the axis), for weights.
CHANNEL_FORMATS = ("int4", "int8_pc")
ELEMENTWISE_FORMATS = ("bf16", "fp16", "fp32")
FORMATS = MX_FORMATS + NV_FORMATS + CHANNEL_FORMATS + ELEMENTWISE_FORMATS
SCALE_RULES = ("floor", "rceil", "ceil", "even", "paper_bump")
ROUNDINGS = ("even", "half_away", "stochastic")

ScaleRule = Literal["floor", "rceil", "ceil", "even", "paper_bump"]
Rounding = Literal["even", "half_away", "stochastic"]


# ``profile`` presets: "ocp" is the corrected behaviour, "paper" what the paper's code ran
# (bf16 pre-rounding in the MX Linear, no LayerNorm bias gradient, bf16 LN internals).
PROFILES = {
    "ocp": {"pre_round": "none", "ln_bias_grad": True, "ln_internals": "fp32"},
    "paper": {"pre_round": "bf16", "ln_bias_grad": False, "ln_internals": "bf16"},
}


def check_format(name: str) -> str:
    """Return ``name`` if it is a known format, else raise ValueError listing the allowed ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; allowed: {', '.join(FORMATS)}")
    return name


class PrecisionSpec(BaseModel):
    """Formats per GEMM role plus the MX options the paper varied.

    Backward formats default to the forward ones. ``quantize_backward=False`` is the paper's
    forward-only mitigation. ``ln`` says how LayerNorm affine parameters are treated:
    quantized in real MX blocks ("mx"), rounded to bf16 ("bf16", what the paper's code did)
    or left alone ("none"). ``profile: paper`` fills ``pre_round``, ``ln_bias_grad`` and
    ``ln_internals`` with what the paper's code ran (see mx.paper); ``ocp`` (default) with
    the corrected behaviour.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    w_fmt: str = "fp32"
    a_fmt: str = "fp32"
    grad_fmt: str | None = None
    bwd_w_fmt: str | None = None
    bwd_a_fmt: str | None = None
    block_size: int = 32
    scale_rule: ScaleRule = "floor"
    rounding: Rounding = "half_away"
    quantize_backward: bool = True
    elementwise: Literal["bf16", "none"] = "none"
    ln: Literal["mx", "bf16", "none"] = "none"
    quantize_gelu: bool = True
    # The paper's own ops (see mx.paper); unset fields follow ``profile``.
    profile: Literal["ocp", "paper"] = "ocp"
    pre_round: Literal["bf16", "none"] | None = None
    ln_bias_grad: bool | None = None
    ln_internals: Literal["bf16", "fp32", "bf16_tail"] | None = None
    # Rounding of the gradient operands of the backward GEMMs; None = ``rounding``.
    grad_rounding: Rounding | None = None
    # Random Hadamard transform (16x16 blocks) of both weight-gradient GEMM operands.
    hadamard_wgrad: bool = False
    # Module-name globs (fnmatch) kept in bf16, e.g. ["lm_head", "blocks.7.*"].
    keep_bf16: tuple[str, ...] = ()
    # NVFP4 weight blocks: 16x16 tiles (one scale for forward and transposed use) or 1x16.
    nvfp4_weight_block: Literal["16x16", "1x16"] = "16x16"

    @field_validator("w_fmt", "a_fmt", "grad_fmt", "bwd_w_fmt", "bwd_a_fmt")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        return None if value is None else check_format(value)

    @field_validator("block_size")
    @classmethod
    def _positive_block(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"block_size must be > 0, got {value}")
        return value

    @model_validator(mode="after")
    def _fill_backward(self) -> PrecisionSpec:
        # Backward roles inherit the forward formats unless given.
        defaults = {"grad_fmt": self.a_fmt, "bwd_w_fmt": self.w_fmt, "bwd_a_fmt": self.a_fmt}
        for field, value in defaults.items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        return self

    @model_validator(mode="after")
    def _fill_profile(self) -> PrecisionSpec:
        for field, value in PROFILES[self.profile].items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        if self.scale_rule == "paper_bump":
            roles = {self.w_fmt, self.a_fmt, self.grad_fmt, self.bwd_w_fmt, self.bwd_a_fmt}
            others = sorted(f for f in roles if f in MX_FORMATS and f != "fp8_e4m3")
            if others:
                raise ValueError(
                    f"scale_rule 'paper_bump' is the paper's E4M3-only exponent bump; "
                    f"got MX format {others[0]!r} (allowed: fp8_e4m3 or element-wise formats)"
                )
        return self

    @property
    def bwd_rounding(self) -> str:
        """Rounding of the gradient operands (``grad_rounding``, else ``rounding``)."""
        return self.grad_rounding or self.rounding

    @property
    def stochastic(self) -> bool:
        """True when some operand is rounded stochastically (a noise source is needed)."""
        return "stochastic" in (self.rounding, self.bwd_rounding)

    @property
    def label(self) -> str:
        """Short configuration name in the paper's style (runfolder.label.precision_label)."""
        return precision_label(self.model_dump())

    @property
    def is_noop(self) -> bool:
        """True when applying this spec cannot change any value (pure fp32)."""
        formats = {self.w_fmt, self.a_fmt, self.grad_fmt, self.bwd_w_fmt, self.bwd_a_fmt}
        return (
            formats == {"fp32"}
            and self.elementwise == "none"
            and self.ln == "none"
            and not self.keep_bf16
            and self.pre_round == "none"
            and self.ln_internals == "fp32"
            and bool(self.ln_bias_grad)
        )

"""Precision interventions ("arms") for branching a run mid-training (torch-free).

Each arm maps the parent's PrecisionSpec to the one its branch continues with, changing
one thing, as in the paper's in-situ interventions.
"""

from __future__ import annotations

from collections.abc import Callable

from mx.spec import PrecisionSpec


def _with(spec: PrecisionSpec, **changes: object) -> PrecisionSpec:
    # Re-validate rather than model_copy(update=...), which would skip the backward-format
    # defaults and the format checks.
    return PrecisionSpec.model_validate({**spec.model_dump(), **changes})


ARMS: dict[str, tuple[str, Callable[[PrecisionSpec], PrecisionSpec]]] = {
    "control": ("unchanged precision (must reproduce the parent)", lambda s: s),
    "full_precision": ("everything back to FP32", lambda s: PrecisionSpec()),
    "rceil": (
        "RCEIL scale rule: bump the shared exponent when the block max would overflow",
        lambda s: _with(s, scale_rule="rceil"),
    ),
    "no_ln_quant": (
        "LayerNorm not quantized (FP32 internals and affine)",
        lambda s: _with(s, ln="none"),
    ),
    "bf16_act_fwd": (
        "bf16 activations in the forward pass only",
        lambda s: _with(s, a_fmt="bf16", grad_fmt=s.grad_fmt, bwd_a_fmt=s.bwd_a_fmt),
    ),
    "bf16_act_fwd_bwd": (
        "bf16 activations forward and backward",
        lambda s: _with(s, a_fmt="bf16", grad_fmt="bf16", bwd_a_fmt="bf16"),
    ),
    "no_bwd_quant": ("no backward-pass quantization", lambda s: _with(s, quantize_backward=False)),
    "no_gelu_quant": ("GELU not quantized", lambda s: _with(s, quantize_gelu=False)),
    "bf16_weights": (
        "bf16 weights (forward and backward)",
        lambda s: _with(s, w_fmt="bf16", bwd_w_fmt="bf16"),
    ),
    # The arms as the paper's code ran them (olmo/synthetic/make_intervention_sweep.py).
    "paper_bump": (
        "the paper's exponent bump (max across blocks per in-block position; E4M3 only)",
        lambda s: _with(s, scale_rule="paper_bump"),
    ),
    "paper_no_ln_quant": (
        "the paper's unquantized LN: FP32 stats but a bf16 normalisation tail, affine unrounded",
        lambda s: _with(s, ln="none", ln_internals="bf16_tail"),
    ),
    "paper_bf16_act_fwd": (
        "bf16 activations forward and in the weight-gradient GEMM (gradients stay MX)",
        lambda s: _with(s, a_fmt="bf16", bwd_a_fmt="bf16", grad_fmt=s.grad_fmt),
    ),
    "paper_no_bwd_quant": (
        "the paper's forward-only MX: the backward in FP32, no bf16 rounding",
        lambda s: _paper_only("paper_no_bwd_quant", _with(s, quantize_backward=False)),
    ),
    "paper_bf16_weights": (
        "bf16 forward weights; the input-gradient weight operand stays MX",
        lambda s: _with(s, w_fmt="bf16", bwd_w_fmt=s.bwd_w_fmt),
    ),
}

# `sweep intervene --arms paper`: the paper's eight interventions plus control.
PAPER_ARMS = (
    "control",
    "full_precision",
    "paper_bump",
    "paper_no_ln_quant",
    "paper_bf16_act_fwd",
    "bf16_act_fwd_bwd",
    "paper_no_bwd_quant",
    "no_gelu_quant",
    "paper_bf16_weights",
)


def _paper_only(arm: str, spec: PrecisionSpec) -> PrecisionSpec:
    # Only the paper's Linear/LayerNorm have an FP32 backward in forward-only mode.
    if spec.pre_round != "bf16":
        raise ValueError(
            f"arm {arm!r} needs the paper's ops (precision.profile: paper or pre_round: bf16); "
            "use no_bwd_quant for this run"
        )
    return spec


def apply_arm(arm: str, spec: PrecisionSpec) -> PrecisionSpec:
    """The precision a branch with intervention ``arm`` runs under."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
    return ARMS[arm][1](spec)

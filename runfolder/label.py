"""The configuration label of a run: the name tables, figures and fits group runs by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def precision_label(precision: Mapping[str, Any]) -> str:
    """Short name of a precision block in the paper's style, ``<w>_<a>`` plus variants.

    ``precision`` is a PrecisionSpec as a mapping (a spec.json's ``precision``); missing keys
    hold their defaults. Variants beyond the paper's add nothing at their defaults, so
    existing labels stay.
    """
    w_fmt, a_fmt = precision.get("w_fmt", "fp32"), precision.get("a_fmt", "fp32")
    name = f"{w_fmt}_{a_fmt}"
    if precision.get("quantize_backward", True) is False:
        name += "_quantize_only_fwd"
    if precision.get("block_size", 32) != 32:
        name += f"_block_size_{precision['block_size']}"
    if precision.get("rounding") == "stochastic":
        name += "_sr"
    elif precision.get("grad_rounding") == "stochastic":
        name += "_sr_grad"
    if precision.get("hadamard_wgrad"):
        name += "_rht"
    if precision.get("keep_bf16"):
        name += f"_keep_bf16_{len(precision['keep_bf16'])}"
    bwd_w_fmt = precision.get("bwd_w_fmt") or w_fmt
    nvfp4_weights = "nvfp4" in (w_fmt, bwd_w_fmt)
    if nvfp4_weights and precision.get("nvfp4_weight_block", "16x16") != "16x16":
        name += "_w1x16"
    return name


def config_label(spec: Mapping[str, Any]) -> str:
    """A run spec's (as a mapping) label: its ``tags.config`` if set, else its precision's."""
    tags = spec.get("tags") or {}
    return tags.get("config") or precision_label(spec.get("precision") or {})

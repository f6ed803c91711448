"""The dtype policy of a run: autocast and parameter dtype, resolved once and recorded.

``train.autocast``: ``auto`` is bf16 for LM runs on CUDA and off for proxy runs and on CPU;
``bf16`` turns ``torch.autocast(device, torch.bfloat16)`` on whatever the device (on CPU it
runs exactly the code a GPU run takes); ``none`` turns it off. ``train.param_dtype: bf16``
computes with bf16 copies of the fp32 master weights (the optimizer keeps fp32), the same
way in one process, under DDP and under FSDP. FP32 references (a paired run's twin, the
``full_precision`` intervention arm) never autocast and always compute in fp32.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from models.config import LMConfig, RunSpec

Autocast = Literal["bf16", "none"]
ParamDtype = Literal["fp32", "bf16"]
# Branch arms that are an FP32 reference by definition.
FP32_ARMS = ("full_precision",)

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def is_fp32_reference(spec: RunSpec) -> bool:
    """True for runs that must compute in plain FP32 whatever the dtype settings say."""
    return spec.branch is not None and spec.branch.arm in FP32_ARMS


def resolve_autocast(spec: RunSpec, device: torch.device) -> Autocast:
    """``bf16`` or ``none`` for the run's ``train.autocast`` on ``device``."""
    if is_fp32_reference(spec):
        return "none"
    setting = spec.train.autocast
    if setting == "auto":
        return "bf16" if isinstance(spec.model, LMConfig) and device.type == "cuda" else "none"
    return setting


def resolve_param_dtype(spec: RunSpec) -> ParamDtype:
    """The dtype the run's layers see their weights in (``fp32`` for FP32 references)."""
    return "fp32" if is_fp32_reference(spec) else spec.train.param_dtype


def torch_dtype(name: ParamDtype) -> torch.dtype:
    """torch dtype of a ``param_dtype`` name."""
    return _TORCH_DTYPES[name]


def autocast_context(mode: Autocast, device: torch.device) -> contextlib.AbstractContextManager:
    """A re-enterable context for the forward passes of a run under ``mode``."""
    if mode == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)

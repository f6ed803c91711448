"""What a run trains, keyed by ``model.kind``: one module per workload registers itself.

A workload builds the (seeded, unquantized) network, whose ``loss(batch)`` is the training
and evaluation loss, and its data source (batches as a pure function of the step, fixed
validation batches, entropy facts for the summary); it also counts the FLOPs that 6·N·D
leaves out. N is the network's parameter count. Adding a workload: a config class with a
new ``kind`` in models.config and a module ``models/workloads/<kind>.py`` that calls
``register``; nothing else in the trainer changes.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import torch
from torch import nn

from models.config import RunSpec


class DataSource(Protocol):
    """Batches of a run: ``train_batch(step)`` is a pure function of (seed, step)."""

    entropy_rate: float | None

    def train_batch(self, step: int) -> Any: ...

    def val_batches(self) -> list[Any]: ...

    def unigram_entropy(self) -> float | None: ...


class Workload(Protocol):
    """The model-specific part of a run."""

    def build(self, spec: RunSpec, device: torch.device) -> tuple[nn.Module, DataSource]:
        """The network (torch's RNG is seeded with ``spec.seed`` first) and its data."""
        ...

    def extra_flops(self, spec: RunSpec, tokens: int) -> float:
        """FLOPs of ``tokens`` training tokens beyond 6·N·D (the summary's ``flops_attn``)."""
        ...


_WORKLOADS: dict[str, Workload] = {}


def register(kind: str, workload: Workload) -> None:
    """Make ``workload`` the one for runs whose ``model.kind`` is ``kind``."""
    _WORKLOADS[kind] = workload


def workload_for(kind: str) -> Workload:
    """The registered workload of ``kind`` (its module is imported on first use)."""
    if kind not in _WORKLOADS:
        try:
            importlib.import_module(f"{__name__}.{kind}")
        except ModuleNotFoundError as error:
            raise ValueError(
                f"model.kind {kind!r}: no module models/workloads/{kind}.py"
            ) from error
    if kind not in _WORKLOADS:
        raise ValueError(f"models/workloads/{kind}.py does not register kind {kind!r}")
    return _WORKLOADS[kind]

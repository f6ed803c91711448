"""Where and how the network runs: the device, the run's precision (mx.apply), and one
replica of network + optimizer, single-process or a DDP replica / FSDP shard, under the
run's autocast and parameter dtype."""

from __future__ import annotations

import contextlib
import math
from types import ModuleType
from typing import Any

import torch
from torch import nn

from models.config import RunSpec, TrainConfig
from models.distributed import (
    World,
    cuda_device,
    full,
    full_state,
    is_sharded,
    load_full_state,
    local_gradients,
    parallelize,
)
from models.dtypes import Autocast, ParamDtype, autocast_context, torch_dtype

Batch = torch.Tensor | tuple[torch.Tensor, ...]


def device_for(name: str, world: World) -> torch.device:
    """The device of ``train.device`` (``auto``: CUDA when there is one), this rank's GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available")
    if name == "cuda" and world.size > 1:
        return cuda_device(world)
    return torch.device(name)


def to_device(batch: Any, device: torch.device) -> Batch:
    """A data source's batch (numpy tokens, a tensor or a tuple of tensors) on ``device``."""
    if isinstance(batch, tuple):
        return tuple(to_device(part, device) for part in batch)
    if not isinstance(batch, torch.Tensor):
        batch = torch.from_numpy(batch)
    return batch.to(device)


def _split(batch: Batch, size: int) -> list[Batch]:
    """Micro-batches of ``size`` samples along dim 0 (a tuple splits part by part)."""
    if isinstance(batch, tuple):
        return list(zip(*(part.split(size) for part in batch), strict=True))
    return list(batch.split(size))


def apply_precision(model: nn.Module, spec: RunSpec) -> tuple[nn.Module, ModuleType | None]:
    """``model`` with the run's precision applied in place, and the ``mx`` package that did
    it (``model`` and None for pure fp32, which imports no quantizer)."""
    if spec.precision.is_noop:
        return model, None
    import mx
    from mx.fast import keep_freed_memory

    # Quantizer temporaries are large and short-lived: reusing freed memory avoids a
    # page fault per 4 KiB on every call (see mx.fast).
    keep_freed_memory()
    return mx.apply(model, spec.precision, seed=spec.seed), mx


class Replica:
    """One network and its optimizer: forward/backward over micro-batches, then an update.

    Across several ranks each one holds a DDP replica or an FSDP shard of the network and
    passes its own slice of every batch; gradients and losses are averaged over the ranks.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        device: torch.device,
        world: World | None = None,
        strategy: str = "ddp",
        autocast: Autocast = "none",
        param_dtype: ParamDtype = "fp32",
    ) -> None:
        self.model, self.cfg, self.device = model.to(device), cfg, device
        self.world = world or World()
        self.net = parallelize(self.model, self.world, strategy, device, torch_dtype(param_dtype))
        # Built after sharding: FSDP replaces the parameters by their shards.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            foreach=True,
        )
        self.micro = cfg.micro_batch_size or cfg.batch_size
        self.autocast = autocast_context(autocast, device)

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Accumulate the gradient of the mean loss over ``batch`` (this rank's slice; the
        gradient is averaged over ranks); return this rank's loss."""
        chunks = _split(batch, self.micro)
        total = torch.zeros((), device=self.device)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            with contextlib.nullcontext() if last else local_gradients(self.net):
                with self.autocast:
                    loss = self.net(chunk) / len(chunks)
                loss.backward()
            total += loss.detach()
        return total

    def update(self, lr: float) -> torch.Tensor:
        """Clip, step and zero the gradients; return the pre-clip gradient norm."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        total_norm = full(nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total_norm

    @torch.no_grad()
    def mean_loss(self, batches: list[Any]) -> float:
        """Mean loss over fixed (global) batches in eval mode, averaged over the ranks."""
        self.net.eval()
        losses = []
        for batch in batches:
            for chunk in _split(to_device(self.world.shard(batch), self.device), self.micro):
                with self.autocast:
                    losses.append(self.net(chunk).float())
        self.net.train()
        return self.world.mean_in_order(torch.stack(losses).view(len(batches), -1)).item()

    def state(self) -> dict[str, Any]:
        """Model and optimizer state in the single-process layout (a sharded network is
        gathered into rank 0: every rank must call this)."""
        if is_sharded(self.net):
            return full_state(self.model, self.optimizer)
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``state`` returned (any world size)."""
        if is_sharded(self.net):
            load_full_state(self.model, self.optimizer, state)
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

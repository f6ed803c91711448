"""Runs that span several processes: where the ranks meet, how the network is wrapped (DDP
or FSDP) and its full state for checkpoints.

Every rank trains on a contiguous slice of the same global batch and gradients are
averaged, so the loss trajectory does not depend on the number of ranks. A world of one
process has no process group and no wrapper: single-process runs are what they always were.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

# strategy "auto" shards models from this size on: below it, replicated fp32 weights and
# AdamW state (16 bytes a parameter) fit one device easily and DDP is simpler and faster.
FSDP_AUTO_MIN_PARAMS = 500_000_000


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of one run (rank 0 of 1 when alone)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files."""
        return self.rank == 0

    def shard(self, batch: Any) -> Any:
        """This rank's contiguous slice of a global batch (an array, tensor or tuple of them)."""
        if self.size == 1:
            return batch
        if isinstance(batch, tuple):
            return tuple(self.shard(part) for part in batch)
        rows = len(batch) // self.size
        return batch[self.rank * rows : (self.rank + 1) * rows]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The average of ``value`` over the ranks (``value`` itself when alone)."""
        if self.size == 1:
            return value
        total = value.detach().clone()
        # Gloo has no AVG reduction; dividing by a power of two afterwards is exact.
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.size

    def mean_in_order(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of every rank's (batches, chunks) ``values`` taken in the order one
        process would have them (batch by batch, rank 0's chunks first): the same sum in
        the same order, so the same bits as a single-process run."""
        if self.size == 1:
            return values.flatten().mean()
        gathered = [torch.empty_like(values) for _ in range(self.size)]
        dist.all_gather(gathered, values.contiguous())
        return torch.stack(gathered, dim=1).flatten().mean()

    def mean_values(self, values: dict[str, float]) -> dict[str, float]:
        """Per-key averages over the ranks of dicts that have the same keys on every rank."""
        if self.size == 1 or not values:
            return values
        keys = sorted(values)
        means = self.mean(torch.tensor([values[k] for k in keys], dtype=torch.float64))
        return dict(zip(keys, means.tolist(), strict=True))

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank."""
        if self.size == 1:
            return flag
        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        """Wait until every rank got here (nothing to wait for when alone)."""
        if self.size > 1:
            dist.barrier()

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object), on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a run meet: this process's place and rank 0's address."""

    world: World
    address: str
    port: int


def rendezvous_from_env(expected: int, env: Mapping[str, str] | None = None) -> Rendezvous | None:
    """The rendezvous torchrun or srun describe in the environment; None for one process.

    torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) win. The
    variables srun gives each task of a step count only for a run that asks for more than
    one process (``expected``): a one-process run may sit inside another job's multi-task
    step (Ray workers on SLURM) and must not wait for ranks that will never come.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
        address = env.get("MASTER_ADDR", "127.0.0.1")
        port = int(env.get("MASTER_PORT", "29500"))
    elif expected > 1 and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        world = World(
            int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]), int(env["SLURM_LOCALID"])
        )
        address = first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        port = slurm_port(env["SLURM_JOB_ID"])
    else:
        return None
    return Rendezvous(world, address, port) if world.size > 1 else None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as ``gpu[03-06,09]``."""
    result = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    hosts = result.stdout.split()
    if result.returncode != 0 or not hosts:
        raise RuntimeError(f"`scontrol show hostnames {nodelist}` failed: {result.stderr.strip()}")
    return hosts[0]


def slurm_port(job_id: str) -> int:
    """A rendezvous port from the job id: distinct for jobs sharing a node (array tasks have
    their own ids), stable across requeues, below Linux's ephemeral range (32768+)."""
    return 10_000 + int(job_id) % 20_000


@contextlib.contextmanager
def joined(expected: int) -> Iterator[World]:
    """Join the process group described by the environment for the run's lifetime.

    NCCL carries CUDA tensors and gloo CPU ones, so small control values (stop flags,
    objects) never wait on the GPU.
    """
    rendezvous = rendezvous_from_env(expected)
    if rendezvous is None:
        yield World()
        return
    world = rendezvous.world
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(cuda_device(world))
    dist.init_process_group(
        backend(cuda),
        init_method=f"tcp://{rendezvous.address}:{rendezvous.port}",
        rank=world.rank,
        world_size=world.size,
    )
    global _JOINED
    _JOINED = True
    try:
        yield world
    finally:
        dist.destroy_process_group()


def backend(cuda: bool) -> str:
    """The process-group backend of a run: NCCL for CUDA tensors plus gloo for CPU ones."""
    return "cuda:nccl,cpu:gloo" if cuda else "gloo"


# Whether this process joined a process group (see ``exit_process``).
_JOINED = False


def exit_process(code: int) -> NoReturn:
    """End this process with ``code``; a rank of a multi-process run skips interpreter
    finalization.

    DDP's reducer keeps the gloo process group, and so its worker and transport threads,
    alive after ``destroy_process_group``. Those threads then race Python's finalization
    and the C++ static destructors at exit, which ends now and then in ``std::terminate``
    ("terminate called without an active exception", SIGABRT) after the run finished and
    wrote its markers. Everything a run writes is already on disk (atomic, fsynced), so a
    rank flushes its output and leaves with ``os._exit``.
    """
    if not _JOINED:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cuda_device(world: World) -> torch.device:
    """This rank's GPU: its local rank among the GPUs it sees (the only one where the
    scheduler binds one GPU to each task)."""
    return torch.device("cuda", world.local_rank % torch.cuda.device_count())


def current_world() -> World:
    """The world this process trains in: the initialised process group, else one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or "0"
    return World(dist.get_rank(), dist.get_world_size(), int(local))


def resolve_strategy(requested: str, n_params: int) -> str:
    """``ddp`` or ``fsdp`` for a requested strategy (``auto``: by parameter count)."""
    if requested != "auto":
        return requested
    return "fsdp" if n_params >= FSDP_AUTO_MIN_PARAMS else "ddp"


class _Loss(nn.Module):
    """``forward(batch)`` is ``model.loss(batch)`` (what ``functional_call`` calls)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> torch.Tensor:
        return self.model.loss(batch)


class LossOf(nn.Module):
    """``forward(batch)`` is ``model.loss(batch)``: DDP and FSDP hook calls, not methods.

    With ``param_dtype`` the loss is computed with copies of the parameters cast to it, so
    gradients reach the (fp32 master) parameters through the cast: FSDP's mixed precision
    for one process or DDP (a sharded network casts in FSDP instead).
    """

    def __init__(self, model: nn.Module, param_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.param_dtype = param_dtype

    def forward(self, batch: Any) -> torch.Tensor:
        if self.param_dtype is None:
            return self.model.loss(batch)
        cast = {
            f"model.{name}": param.to(self.param_dtype)
            for name, param in self.model.named_parameters()
        }
        return torch.func.functional_call(_Loss(self.model), cast, (batch,))


def parallelize(
    model: nn.Module,
    world: World,
    strategy: str,
    device: torch.device,
    param_dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """The module to call for the loss: ``LossOf(model)``, wrapped in DDP or fully sharded
    (each residual block, then the whole) when several ranks train. ``model`` must already
    sit on ``device``; FSDP shards it in place, keeping its parameter names. Alone, without
    a process group, it stays unwrapped.

    ``param_dtype`` is what the layers compute with, the same on every path: fp32 master
    weights in the optimizer, gradients averaged over ranks in fp32.
    """
    cast = None if param_dtype == torch.float32 else param_dtype
    # A one-rank process group (bench.gpu_check) takes the multi-rank path on purpose.
    if world.size == 1 and not (dist.is_available() and dist.is_initialized()):
        return LossOf(model, cast)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        # The only buffers are constant RoPE tables: nothing to broadcast each step.
        return DistributedDataParallel(
            LossOf(model, cast), device_ids=ids, forward_sync_buffers=False
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    net = LossOf(model)
    # Inputs keep their dtype (as in one process): casting the RoPE tables would change them.
    policy = MixedPrecisionPolicy(
        param_dtype=cast, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    for block in getattr(model, "blocks", []):
        fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    return net


def is_sharded(net: nn.Module) -> bool:
    """True when ``net`` is fully sharded (its parameters are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(net, FSDPModule)


@contextlib.contextmanager
def local_gradients(net: nn.Module) -> Iterator[None]:
    """Backward passes inside keep gradients local (no all-reduce or reduce-scatter): all
    micro-batches but the last accumulate, and the last one synchronises once."""
    if is_sharded(net):
        net.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            net.set_requires_gradient_sync(True)
    elif hasattr(net, "no_sync"):
        with net.no_sync():
            yield
    else:
        yield


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor of the whole value (a DTensor is gathered or reduced; collective)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Unsharded model and optimizer state of a sharded model, on CPU in rank 0 (empty on
    the other ranks), in the layout of a single-process ``state_dict()`` so that any world
    size can load it. Collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if not model_state:
        return {"model": {}, "optimizer": {}}
    return {"model": model_state, "optimizer": _optimizer_by_index(optim_state)}


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Shard a full (single-process layout) state onto this rank's model and optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = [name for name, _ in model.named_parameters()]
    set_state_dict(
        model,
        optimizer,
        model_state_dict=dict(state["model"]),
        optim_state_dict=_optimizer_by_name(state["optimizer"], names),
        options=StateDictOptions(full_state_dict=True),
    )


def _optimizer_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """Parameter-name keys (torch.distributed.checkpoint) -> positions (Optimizer.state_dict)."""
    names = [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def _optimizer_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Positions -> parameter names, the inverse of ``_optimizer_by_index``."""
    return {
        "state": {names[i]: dict(value) for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }

"""Executors by name: each executor class registers itself, callers ask the registry.

Nothing outside ``sweep/executors/`` compares executor names: it looks the class up here
(``executor_class(name)``) and asks it (``waits_for_runs``, ``tracks_pids``, ...). Kept
import-light (standard library only, executor modules import their heavy parts lazily):
``sweep status`` reaches it on its fast path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sweep.errors import GridError

if TYPE_CHECKING:
    from sweep.executors.base import BaseExecutor

AUTO = "auto"
# The executors that ship with mxscale; importing one registers it.
_BUILTIN_MODULES = ("sweep.executors.local", "sweep.executors.slurm", "sweep.executors.ray_exec")
_REGISTRY: dict[str, type[BaseExecutor]] = {}
_T = TypeVar("_T", bound="type[BaseExecutor]")


def register(name: str) -> Callable[[_T], _T]:
    """Class decorator: make an executor class known as ``name`` (``--executor NAME``)."""

    def add(cls: _T) -> _T:
        if name == AUTO or (name in _REGISTRY and _REGISTRY[name] is not cls):
            raise ValueError(f"executor name {name!r} is taken")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def executor_names() -> tuple[str, ...]:
    """The registered executor names: the built-ins in their order, then the others in
    registration order (not import order, which depends on who imported what first)."""
    _load_builtins()

    def rank(name: str) -> int:
        module = _REGISTRY[name].__module__
        return _BUILTIN_MODULES.index(module) if module in _BUILTIN_MODULES else len(_REGISTRY)

    return tuple(sorted(_REGISTRY, key=rank))


def executor_choices() -> tuple[str, ...]:
    """What ``--executor`` and a grid's ``launch.executor`` accept: ``auto`` and every name."""
    return (AUTO, *executor_names())


def executor_class(name: str) -> type[BaseExecutor]:
    """The class registered as ``name``; GridError (exit 2) naming the allowed ones."""
    _load_builtins()
    if name not in _REGISTRY:
        raise GridError(f"unknown executor {name!r}; allowed: {', '.join(executor_choices())}")
    return _REGISTRY[name]


def known(name: str | None) -> type[BaseExecutor] | None:
    """The class registered as ``name``, or None (a record written by an unknown executor)."""
    _load_builtins()
    return _REGISTRY.get(name) if isinstance(name, str) else None


def _auto_candidates() -> list[type[BaseExecutor]]:
    classes = [executor_class(name) for name in executor_names()]
    picked = [cls for cls in classes if cls.auto_priority is not None]
    return sorted(picked, key=lambda cls: cls.auto_priority)


def describe_choices() -> str:
    """``--executor``'s help: the names, and what ``auto`` picks."""
    auto = ", else ".join(f"{cls.name}{cls.auto_when}" for cls in _auto_candidates())
    return " | ".join(executor_names()) + f" | {AUTO} ({auto})"


def resolve_executor_name(requested: str) -> str:
    """A registered name; ``auto`` picks the detected executor of lowest ``auto_priority``
    (slurm where sbatch is on PATH, else local)."""
    if requested != AUTO:
        return executor_class(requested).name
    return next(cls.name for cls in _auto_candidates() if cls.detected())

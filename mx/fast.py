"""Optional ``torch.compile`` fast path for the block kernels of ``mx.quantizer``.

The eager kernels are the reference; compiling the same torch code fuses the block
reduction and the element-wise bit arithmetic into one loop (10x+ on CPU). Compilation
costs seconds per (kernel, format, options) and is only worth it for big tensors, so
"auto" compiles above ``MIN_NUMEL`` elements and uses dynamic block counts so a
training run with changing sizes compiles once per kernel and layout. The mode comes
from the ``MX_FAST`` environment variable ("auto", "on", "off") or ``set_mode``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

MODES = ("auto", "on", "off")
MIN_NUMEL = 1 << 16

_mode = os.environ.get("MX_FAST", "auto")
_compiled: dict[tuple, Callable[..., torch.Tensor]] = {}
_broken = False  # set when compilation failed once: stay eager for the process


def set_mode(mode: str) -> None:
    """Select "auto" (compile big tensors when a C compiler exists), "on" or "off"."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"unknown fast mode {mode!r}; allowed: {', '.join(MODES)}")
    _mode = mode


def get_mode() -> str:
    """The current fast-path mode."""
    return _mode


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed big blocks instead of returning them to the OS.

    Fresh 64 MiB tensors otherwise cost a page fault per 4 KiB on every call, which
    is slower than the fused quantizer itself. Opt-in because it is process-wide;
    returns False where glibc's ``mallopt`` is unavailable.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30))


def _wants_compile(blocks: torch.Tensor) -> bool:
    if _broken or _mode == "off" or torch.compiler.is_compiling():
        return False
    if _mode == "on":
        return True
    if _mode != "auto":
        raise ValueError(f"MX_FAST={_mode!r} is not one of: {', '.join(MODES)}")
    if blocks.numel() < MIN_NUMEL:
        return False
    return blocks.device.type != "cpu" or _has_c_compiler(os.environ.get("CC", "gcc"))


@functools.cache
def _has_c_compiler(name: str) -> bool:
    # Looked up once per process: a PATH scan per call cost more than small quantizes.
    return shutil.which(name) is not None


def _compile(kernel: Callable[..., torch.Tensor], options: tuple) -> Callable[..., torch.Tensor]:
    def call(blocks: torch.Tensor) -> torch.Tensor:
        return kernel(blocks, *options)

    # Dynamo keeps its graph cache (and its recompile limit) per code object; a private
    # copy of the code per option tuple stops the variants from evicting each other.
    code = call.__code__.replace(co_name=f"mx_{len(_compiled)}")
    call = types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)
    return torch.compile(call, fullgraph=True)


def run(
    kernel: Callable[..., torch.Tensor],
    blocks: torch.Tensor,
    *options: Any,
    static_dims: tuple[int, ...] = (2,),
) -> torch.Tensor:
    """Run ``kernel(blocks, *options)``, compiled when the mode and size make it worthwhile.

    ``options`` must be hashable constants; each distinct tuple gets its own compiled graph.
    Dims other than ``static_dims`` (the block length, so the inner loop vectorizes) are
    marked dynamic up front, so a run compiles once per layout rather than once per shape.
    """
    global _broken
    with torch.no_grad():
        if not _wants_compile(blocks):
            return kernel(blocks, *options)
        key = (kernel, *options)
        fn = _compiled.get(key)
        if fn is None:
            fn = _compiled[key] = _compile(kernel, options)
        for dim, size in enumerate(blocks.shape):
            if size > 1 and dim not in static_dims:
                torch._dynamo.maybe_mark_dynamic(blocks, dim)
        try:
            return fn(blocks)
        except Exception as exc:  # noqa: BLE001 - any compiler failure means "use eager"
            _broken = True
            warnings.warn(f"mx fast path disabled, compile failed: {exc}", stacklevel=2)
            return kernel(blocks, *options)

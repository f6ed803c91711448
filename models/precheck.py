"""Checks of a run spec against the network it builds, cheap enough for launch time.

The network is built on the meta device (shapes only, no memory, no init cost), so a
``precision.keep_bf16`` glob that matches no module is refused before anything runs.
"""

from __future__ import annotations

from models.config import ProxyConfig, RunSpec


def unmatched_keep_bf16(spec: RunSpec) -> tuple[list[str], list[str]]:
    """(globs of ``precision.keep_bf16`` that match no module, the network's module names);
    empty lists when every glob matches."""
    from mx.recipe import UnmatchedGlobs, kept_modules

    if not spec.precision.keep_bf16:
        return [], []
    try:
        kept_modules(_meta_network(spec), spec.precision.keep_bf16)
    except UnmatchedGlobs as err:
        return err.globs, err.names
    return [], []


def _meta_network(spec: RunSpec):
    import torch

    with torch.device("meta"):
        if isinstance(spec.model, ProxyConfig):
            from models.proxy import Student

            return Student(spec.model)
        from models.transformer import TransformerLM

        return TransformerLM(spec.model)

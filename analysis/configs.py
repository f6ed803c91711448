"""Precision-configuration names: parsing, ordering and one colour per configuration.

Torch-free on purpose: the format list mirrors ``mx.spec.FORMATS`` because analysis/ must not
import mx (it runs where torch is absent).
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from matplotlib import colormaps

FORMATS = (
    "fp8_e4m3",
    "fp8_e5m2",
    "fp6_e3m2",
    "fp6_e2m3",
    "fp4_e2m1",
    "int8",
    "nvfp4",
    "int8_pc",
    "int4",
    "bf16",
    "fp16",
    "fp32",
)
HIGH_PRECISION = ("bf16", "fp16", "fp32")
# The paper logs bf16 activations as "bfloat16".
_ALIASES = {"bfloat16": "bf16"}
BASELINE = "bf16_bf16"

# Paper configurations in a fixed order so every figure gives each one the same colour.
KNOWN_CONFIGS = (
    "bf16_bf16",
    "fp8_e4m3_fp8_e4m3",
    "fp8_e4m3_fp8_e5m2",
    "fp8_e5m2_fp8_e4m3",
    "fp8_e5m2_fp8_e5m2",
    "fp6_e2m3_fp6_e2m3",
    "fp6_e2m3_fp6_e3m2",
    "fp6_e3m2_fp6_e2m3",
    "fp6_e3m2_fp6_e3m2",
    "fp6_e2m3_fp8_e4m3",
    "fp6_e2m3_fp8_e5m2",
    "fp8_e5m2_bf16",
    "fp6_e2m3_bf16",
    "fp8_e4m3_fp8_e4m3_quantize_only_fwd",
    "fp8_e5m2_fp8_e5m2_quantize_only_fwd",
    "fp8_e5m2_fp8_e5m2_block_size_2",
    "fp8_e4m3_bf16",
    "fp32_fp32",
    "fp4_e2m1_fp4_e2m1",  # the demo's MXFP4 (appended: earlier colours stay)
)


class Config(NamedTuple):
    """A parsed configuration name: ``<w_fmt>_<a_fmt>[_<variant>]``."""

    w_fmt: str
    a_fmt: str
    variant: str

    @property
    def name(self) -> str:
        base = f"{self.w_fmt}_{self.a_fmt}"
        return f"{base}_{self.variant}" if self.variant else base

    @property
    def fully_mx(self) -> bool:
        """MX in weights and activations, forward and backward (the paper's unstable group)."""
        mx_both = self.w_fmt not in HIGH_PRECISION and self.a_fmt not in HIGH_PRECISION
        return mx_both and "quantize_only_fwd" not in self.variant


def _take_format(text: str) -> tuple[str, str]:
    for fmt in sorted((*FORMATS, *_ALIASES), key=len, reverse=True):
        if text == fmt or text.startswith(fmt + "_"):
            return _ALIASES.get(fmt, fmt), text[len(fmt) + 1 :]
    raise ValueError(
        f"cannot parse a format at the start of {text!r}; allowed: {', '.join(FORMATS)}"
    )


def parse_config(name: str) -> Config:
    """Split ``'fp8_e5m2_bfloat16_quantize_only_fwd'`` into weight/activation format and variant."""
    w_fmt, rest = _take_format(name)
    if not rest:
        raise ValueError(
            f"config {name!r} names only one format; expected '<w_fmt>_<a_fmt>[_variant]'"
        )
    a_fmt, variant = _take_format(rest)
    return Config(w_fmt, a_fmt, variant)


def config_order(names: list[str] | set[str]) -> list[str]:
    """Known configurations in the paper's order, then any others alphabetically."""
    known = [c for c in KNOWN_CONFIGS if c in names]
    return known + sorted(set(names) - set(known))


def config_color(name: str) -> tuple[float, float, float, float]:
    """The same RGBA colour for a configuration in every figure (paper or sweep)."""
    palette = colormaps["tab20"]
    if name in KNOWN_CONFIGS:
        # tab20 comes in dark/light pairs: use all dark shades before any light one.
        i = KNOWN_CONFIGS.index(name) % palette.N
        return palette((2 * i) % palette.N + (2 * i) // palette.N)
    return palette(zlib.crc32(name.encode()) % palette.N)

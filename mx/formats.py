"""Element formats of the OCP MX v1.0 spec plus the element-wise float formats.

An MX element is a small float (or INT8 fixed point) that is multiplied by a shared
E8M0 block scale. The quantizer only needs, per format: how many mantissa bits survive,
the smallest normal exponent (below it the grid spacing stops shrinking), the largest
exponent (what the FLOOR scale rule aligns the block max with) and the saturation value.
"""

from __future__ import annotations

from dataclasses import dataclass

from mx.spec import ELEMENTWISE_FORMATS, FORMATS, MX_FORMATS, check_format

E8M0_BIAS = 127
E8M0_MIN_EXP = -127  # byte 0x00; 0xFF is NaN, so the largest finite exponent is +127
E8M0_MAX_EXP = 127


@dataclass(frozen=True)
class ElemFormat:
    """Rounding grid of one element format (values are for a block scale of 1).

    For INT8 the grid is uniform: ``mbits`` fractional bits below ``emin`` = 0, which the
    generic float rule reproduces by treating every value as "subnormal" (``emax`` = 0).
    """

    name: str
    ebits: int
    mbits: int
    emax: int  # exponent of the largest normal value (FLOOR aligns amax with it)
    emin: int  # exponent of the smallest normal value
    max_normal: float
    is_int: bool = False

    @property
    def quantum_floor(self) -> int:
        """log2 of the smallest step of the grid (the min subnormal or the INT8 step)."""
        return self.emin - self.mbits


def _float(name: str, ebits: int, mbits: int, max_normal: float) -> ElemFormat:
    bias = 2 ** (ebits - 1) - 1
    emax = int(max_normal).bit_length() - 1
    return ElemFormat(name, ebits, mbits, emax=emax, emin=1 - bias, max_normal=max_normal)


ELEM_FORMATS: dict[str, ElemFormat] = {
    "fp8_e4m3": _float("fp8_e4m3", 4, 3, 448.0),
    "fp8_e5m2": _float("fp8_e5m2", 5, 2, 57344.0),
    "fp6_e3m2": _float("fp6_e3m2", 3, 2, 28.0),
    "fp6_e2m3": _float("fp6_e2m3", 2, 3, 7.5),
    "fp4_e2m1": _float("fp4_e2m1", 2, 1, 6.0),
    # MXINT8: two's complement x 2^-6; -2.0 is never produced (symmetric saturation).
    "int8": ElemFormat("int8", 0, 6, emax=0, emin=0, max_normal=127 / 64, is_int=True),
}


def elem_format(name: str) -> ElemFormat:
    """Look up an MX element format by name; ValueError for unknown or element-wise ones."""
    check_format(name)
    if name not in ELEM_FORMATS:
        raise ValueError(
            f"format {name!r} has no MX block scale; MX formats are: {', '.join(MX_FORMATS)}"
        )
    return ELEM_FORMATS[name]


__all__ = [
    "E8M0_BIAS",
    "E8M0_MAX_EXP",
    "E8M0_MIN_EXP",
    "ELEMENTWISE_FORMATS",
    "ELEM_FORMATS",
    "FORMATS",
    "MX_FORMATS",
    "ElemFormat",
    "elem_format",
]

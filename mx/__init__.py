"""MX (Microscaling) emulation: formats, fake-quantizer, quantized layers.

Only ``mx.spec`` is imported eagerly so configs load without torch; the torch-backed
API (quantize, apply, remove, clip_rate, ...) is imported on first attribute access.
The quantizer lives in ``mx.quantizer`` (not ``mx.quantize``) so that importing the
module never shadows the ``mx.quantize`` function.
"""

from mx.spec import FORMATS, MX_FORMATS, PrecisionSpec

_LAZY = {
    "quantize": "mx.quantizer",
    "apply": "mx.layers",
    "remove": "mx.layers",
    "clip_rate": "mx.quantizer",
    "clip_rates": "mx.layers",
    "set_clip_tracking": "mx.layers",
    "rounding_state": "mx.recipe",
    "load_rounding_state": "mx.recipe",
}

__all__ = ["FORMATS", "MX_FORMATS", "PrecisionSpec", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return getattr(module, name)
    raise AttributeError(f"module 'mx' has no attribute {name!r}")

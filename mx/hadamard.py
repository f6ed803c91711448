"""Random Hadamard transform (RHT) of the weight-gradient GEMM operands.

dW = G^T X contracts over tokens. With H = block-diagonal copies of H16·diag(s)/4 along the
token axis (H16 the Sylvester Hadamard matrix, s random signs from a seed) H is
orthogonal, so (HG)^T (HX) = G^T X exactly in real arithmetic; quantizing HG and HX
instead of G and X spreads outliers over 16 tokens and narrows each block's amax/rms.
A token count that is not a multiple of 16 is zero-padded (zero rows add nothing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SIZE = 16


def hadamard_matrix(size: int = SIZE) -> torch.Tensor:
    """Sylvester Hadamard matrix (entries ±1) of a power-of-two ``size``."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {size}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_signs(seed: int, size: int = SIZE) -> torch.Tensor:
    """±1 signs drawn from ``seed`` (a generator of its own, so training RNG is untouched)."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, 2, (size,), generator=gen).float() * 2 - 1


def rht_matrix(seed: int, size: int = SIZE) -> torch.Tensor:
    """The orthogonal ``size``×``size`` block H16·diag(s)/√size."""
    return hadamard_matrix(size) * random_signs(seed, size) / size**0.5


def transform_rows(x2d: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Apply the block-diagonal transform along dim 0 of a (tokens, features) matrix.

    Returns ``(tokens + pad, features)`` rows: callers contract over them, so the padding
    rows never need to be removed.
    """
    size = block.shape[0]
    pad = -x2d.shape[0] % size
    rows = F.pad(x2d, (0, 0, 0, pad)) if pad else x2d
    groups = rows.reshape(-1, size, rows.shape[1])
    return torch.matmul(block.to(rows.dtype), groups).reshape(-1, rows.shape[1])

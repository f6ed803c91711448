"""The paper's student-teacher proxy: residual MLP student, frozen teacher, Gaussian inputs.

Only plain ``nn.Linear``, ``nn.LayerNorm`` and ``nn.GELU`` modules carry the GEMMs and
element-wise ops, so ``mx.apply`` quantizes the student exactly as it does the LM. The
teacher is part of the data source and is never quantized.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from models.config import ProxyConfig
from mx.spec import PrecisionSpec

# Seeds of the teacher and of the validation inputs are offset from the run seed so the
# three random streams never coincide.
_TEACHER_OFFSET, _VAL_OFFSET = 7_919, 1_000_003


class _SwiGLU(nn.Module):
    """SiLU-gated unit over a fc1 output of twice the hidden width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def _activation(name: str) -> nn.Module:
    return {"gelu": nn.GELU, "relu": nn.ReLU, "swiglu": _SwiGLU, "linear": nn.Identity}[name]()


class StudentBlock(nn.Module):
    """x + fc2(act(fc1(LN(x)))), LN with affine weight and bias, fc1 without bias."""

    def __init__(self, cfg: ProxyConfig) -> None:
        super().__init__()
        d, hidden = cfg.width, cfg.mlp_ratio * cfg.width
        self.ln = nn.LayerNorm(d) if cfg.layernorm else nn.Identity()
        self.fc1 = nn.Linear(d, 2 * hidden if cfg.activation == "swiglu" else hidden, bias=False)
        self.act = _activation(cfg.activation)
        self.fc2 = nn.Linear(hidden, d, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bf16 weights (train.param_dtype) take bf16 inputs, as the LM's embedding gives
        # them; read here, where FSDP has gathered the block's weights. No-op for fp32.
        x = x.to(self.fc1.weight.dtype)
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class Student(nn.Module):
    """The trained residual MLP; ``loss`` takes an (inputs, targets) batch."""

    def __init__(self, cfg: ProxyConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(StudentBlock(cfg) for _ in range(cfg.depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return F.mse_loss(self(inputs).float(), targets)


class Teacher(nn.Module):
    """``depth`` layers of Linear -> act -> Linear, no residual, no LN; frozen."""

    def __init__(self, cfg: ProxyConfig, seed: int) -> None:
        super().__init__()
        generator_state = torch.get_rng_state()
        torch.manual_seed(seed)
        d, hidden = cfg.width, cfg.teacher_width or cfg.mlp_ratio * cfg.width
        gated, bias = cfg.activation == "swiglu", cfg.teacher_bias
        layers: list[nn.Module] = []
        for _ in range(cfg.depth):
            fc1 = nn.Linear(d, 2 * hidden if gated else hidden, bias=bias)
            layers += [fc1, _activation(cfg.activation), nn.Linear(hidden, d, bias=bias)]
        self.net = nn.Sequential(*layers)
        torch.set_rng_state(generator_state)
        with torch.no_grad():
            for param in self.parameters():
                param.mul_(cfg.teacher_init_scale)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _changes_linear(precision: PrecisionSpec | None) -> bool:
    """Whether ``precision`` changes what a Linear/GELU computes (the teacher has no LN)."""
    if precision is None:
        return False
    p = precision
    formats = {p.w_fmt, p.a_fmt, p.grad_fmt, p.bwd_w_fmt, p.bwd_a_fmt}
    return formats != {"fp32"} or p.elementwise != "none" or p.pre_round != "none"


class TeacherData:
    """Batches as a pure function of (seed, step): x ~ N(0, I), y = teacher(x) + noise."""

    entropy_rate = None

    def __init__(
        self,
        cfg: ProxyConfig,
        *,
        batch_size: int,
        eval_batches: int,
        seed: int,
        device,
        precision: PrecisionSpec | None = None,
    ) -> None:
        self.cfg, self.batch_size, self.seed = cfg, batch_size, seed
        self.device = torch.device(device)
        teacher_seed = cfg.teacher_seed if cfg.teacher_seed is not None else seed + _TEACHER_OFFSET
        self.teacher = Teacher(cfg, teacher_seed).to(self.device)
        self._val = [self._batch(seed + _VAL_OFFSET + i, -1) for i in range(eval_batches)]
        # teacher_precision "student": training targets through the student's MX ops, as the
        # paper's global monkeypatching did (validation targets stay FP32).
        self.train_teacher = self.teacher
        if cfg.teacher_precision == "student" and _changes_linear(precision):
            import mx

            self.train_teacher = mx.apply(copy.deepcopy(self.teacher), precision)

    def _batch(self, seed: int, step: int, teacher: nn.Module | None = None):
        generator = torch.Generator(self.device).manual_seed(seed * 1_000_003 + step + 1)
        shape = (self.batch_size, self.cfg.width)
        x = torch.randn(shape, generator=generator, device=self.device)
        noise = torch.randn(shape, generator=generator, device=self.device)
        if teacher is not None and teacher is not self.teacher:
            # fresh noise: not the draw an FP32 run of the same seed sees
            noise = torch.randn(shape, generator=generator, device=self.device)
        with torch.no_grad():
            y = (teacher or self.teacher)(x) + self.cfg.noise_std * noise
        return x, y

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of 0-based update ``step``."""
        return self._batch(self.seed, step, self.train_teacher)

    def val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed validation batches (disjoint seeds from training)."""
        return self._val

    def unigram_entropy(self) -> None:
        return None

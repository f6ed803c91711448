"""The student-teacher proxy (models.proxy): MSE of the student on teacher targets."""

from __future__ import annotations

import torch
from torch import nn

from models.config import RunSpec
from models.proxy import Student, TeacherData
from models.workloads import DataSource, register


class StudentTeacher:
    """A residual MLP student regressing a frozen random teacher."""

    def build(self, spec: RunSpec, device: torch.device) -> tuple[nn.Module, DataSource]:
        data = TeacherData(
            spec.model,
            batch_size=spec.train.batch_size,
            eval_batches=spec.train.eval_batches,
            seed=spec.seed,
            device=device,
            precision=spec.precision,
        )
        # The student's initial weights do not depend on how the teacher was drawn.
        torch.manual_seed(spec.seed)
        return Student(spec.model), data

    def extra_flops(self, spec: RunSpec, tokens: int) -> float:
        return 0.0


register("proxy", StudentTeacher())

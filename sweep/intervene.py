"""`sweep intervene`: branch runs from a parent's state with one precision change each.

Each (branch step x arm) becomes a run of the same sweep whose spec is the parent's with
the arm's precision and a ``branch`` link; it starts from the parent's full training state
at that step (see models.branch), so the ``control`` arm reproduces the parent exactly.
Branches are launched by the same machinery as grid runs, on any executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models.config import Branch, RunSpec
from mx.arms import ARMS, PAPER_ARMS, apply_arm
from sweep.errors import GridError, SweepError
from sweep.executors.registry import resolve_executor_name
from sweep.grid import LaunchSettings
from sweep.launch import LaunchOptions, LaunchResult, check_specs, submit_specs
from sweep.store import RunRecord, SweepStore

# "all": every arm except the paper's variants ("paper" selects those, see mx.arms).
DEFAULT_ARMS = tuple(a for a in ARMS if not a.startswith("paper_"))


@dataclass(frozen=True)
class BranchPlan:
    """The branch points resolved for one parent, and why they were chosen."""

    parent: str
    steps: list[int]
    reason: str


def parse_arms(text: str) -> list[str]:
    """Comma-separated arm names ("all" for the OCP arms, "paper" for the paper's), checked
    against mx.arms.ARMS."""
    presets = {"all": list(DEFAULT_ARMS), "paper": list(PAPER_ARMS)}
    names = presets.get(text.strip()) or [a.strip() for a in text.split(",")]
    unknown = [a for a in names if a not in ARMS]
    if unknown or not names:
        raise GridError(
            f"--arms: unknown arm {unknown[0] if unknown else text!r}; allowed: all, paper, "
            + ", ".join(ARMS)
        )
    return list(dict.fromkeys(names))


def resolve_parent(store: SweepStore, run: str) -> RunRecord:
    """The parent run named by id (or unique id prefix, or run folder path)."""
    name = Path(run).name
    matches = [r for r in store.run_ids() if r.startswith(name)]
    if len(matches) != 1:
        found = "no run" if not matches else f"{len(matches)} runs"
        raise SweepError(f"{store.root}: {found} match {run!r}; give a run id from `sweep status`")
    return store.record(matches[0], time.time())


def detected_onset(sweep_dir: Path, run_id: str) -> int | None:
    """First sign of instability in the run's train loss (spike, MA rise or divergence)."""
    from analysis.interventions import loss_curves, trouble_step

    curve = loss_curves(sweep_dir, [run_id]).get(run_id)
    return None if curve is None else trouble_step(curve, after=0)


def unstable_runs(store: SweepStore, configs: list[str] | None = None) -> list[str]:
    """Ids of the sweep's own (unbranched) runs that diverged or show an instability onset,
    of the given configurations only (tags.config) when ``configs`` is given."""
    found = []
    for record in store.records():
        if record.spec.get("branch") or record.state not in ("done", "diverged"):
            continue
        if configs and record.config not in configs:
            continue
        if record.state == "diverged" or detected_onset(store.root, record.run_id) is not None:
            found.append(record.run_id)
    return found


def plan_branches(store: SweepStore, parent: RunRecord, at: str, before: list[int]) -> BranchPlan:
    """Branch steps for ``--at STEP`` or ``--at onset``, each minus every ``--before`` offset."""
    if at == "onset":
        onset = detected_onset(store.root, parent.run_id)
        summary = parent.summary or {}
        if onset is None and summary.get("diverged_step"):
            onset = int(summary["diverged_step"])
        if onset is None:
            raise SweepError(
                f"run {parent.run_id}: no instability onset detected in its train loss; "
                "give --at STEP"
            )
        anchor, reason = onset, f"detected onset at step {onset}"
    else:
        try:
            anchor = int(at)
        except ValueError:
            raise GridError(f"--at: expected a step number or 'onset', got {at!r}") from None
        reason = f"step {anchor}"
    total = parent.total_steps
    steps = sorted({anchor - offset for offset in (before or [0])})
    bad = [s for s in steps if not 0 < s < total]
    if bad:
        raise GridError(
            f"--at/--before give branch step {bad[0]}; it must lie in 1..{total - 1} "
            f"(run {parent.run_id} has {total} steps)"
        )
    return BranchPlan(parent.run_id, steps, reason)


def branch_specs(parent_spec: RunSpec, plan: BranchPlan, arms: list[str]) -> list[RunSpec]:
    """One spec per (branch step, arm): the parent's spec under the arm's precision."""
    specs = []
    for step in plan.steps:
        for arm in arms:
            # Its own config label keeps branches out of their parent's config in tables.
            config = f"{parent_spec.label}+{arm}@{step}"
            tags = {**parent_spec.tags, "config": config, "arm": arm, "parent": plan.parent}
            specs.append(
                parent_spec.model_copy(
                    update={
                        "precision": apply_arm(arm, parent_spec.precision),
                        "branch": Branch(parent=plan.parent, step=step, arm=arm),
                        "tags": tags,
                    }
                )
            )
    return specs


def intervene(
    sweep_dir: Path,
    runs: list[str],
    at: str,
    before: list[int],
    arms: list[str],
    options: LaunchOptions,
    on_start: Callable[[list[RunRecord], str], None] | None = None,
) -> tuple[LaunchResult, list[BranchPlan]]:
    """Create the branch runs for every parent in ``runs`` and submit those not yet done."""
    store = SweepStore(sweep_dir)
    if not store.exists():
        raise SweepError(f"{sweep_dir}: not a launched sweep (no sweep.json)")
    plans, specs = [], []
    if not runs:
        raise GridError("name at least one parent run (or pass --unstable)")
    for run in runs:
        parent = resolve_parent(store, run)
        parent_spec = RunSpec.model_validate(parent.spec)
        plan = plan_branches(store, parent, at, before)
        plans.append(plan)
        specs += branch_specs(parent_spec, plan, arms)
    # The sweep's frozen launch section under the command's flags, as for `sweep launch`.
    settings = options.effective(_frozen_launch_settings(store))
    executor_name = resolve_executor_name(settings.executor)
    check_specs(str(sweep_dir), specs, executor_name, settings)
    result = LaunchResult(None, executor=executor_name, sweep_dir=store.root)
    if options.dry_run:
        result.to_submit = [
            RunRecord(
                s.run_id,
                store.runs_dir / s.run_id,
                s.model_dump(mode="json"),
                "pending",
                None,
                None,
                None,
            )
            for s in specs
        ]
        return result, plans
    ids = [s.run_id for s in specs]
    submit_specs(
        store,
        specs,
        settings,
        options,
        lambda: store.add_branches(ids),
        on_start,
        result,
        only=set(ids),
    )
    return result, plans


def _frozen_launch_settings(store: SweepStore) -> LaunchSettings:
    """The ``launch`` section of the grid frozen in the sweep folder (defaults if absent)."""
    import yaml

    path = store.root / "grid.yaml"
    raw = yaml.safe_load(path.read_text()) if path.exists() else None
    section = (raw or {}).get("launch") or {}
    return LaunchSettings.model_validate(section)

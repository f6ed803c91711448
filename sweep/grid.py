"""Grid YAML schema and its expansion into fully resolved, content-hashed RunSpecs.

A grid has a ``base`` (a partial RunSpec shared by every run) and ``axes`` whose values
override parts of it. Axes are crossed, except groups listed in ``zip`` which advance
together. A ``budget`` axis derives the step count from C = 6·N·D.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from models.config import RunSpec
from models.flops import steps_for_budget
from mx.spec import FORMATS
from sweep.errors import GridError
from sweep.executors.registry import executor_choices
from sweep.safe_yaml import YamlBudgetError, load_untrusted

SPECIAL_AXES = ("budget", "seed", "precision", "shape", "d_model")
RUNSPEC_FIELDS = tuple(RunSpec.model_fields)
# RunSpec fields that are mappings; axes write into them.
SECTIONS = ("model", "data", "train", "precision", "resources", "tags")
# A sweep name becomes a folder under sweeps/: one path component, no dot-only names.
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# Geomspace and expansion caps keep a typo (num: 1e9) from allocating before it is refused.
MAX_GEOMSPACE = 10_000
DEFAULT_MAX_RUNS = 20_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Filters(_Strict):
    """Which expanded points to keep."""

    tokens_per_param: tuple[float, float] | None = Field(
        default=None, description="keep points with lo < D/N < hi (the paper: [2, 200])"
    )
    min_steps: int = Field(default=1, ge=1, description="drop points with fewer steps")


class LaunchSettings(_Strict):
    """How runs are launched: a grid's ``launch`` section, and the flags of every command
    that launches (``sweep launch``, ``sweep intervene``), which override it."""

    # Any registered executor (sweep.executors.registry), or auto.
    executor: Literal[executor_choices()] = "auto"  # type: ignore[valid-type]
    workers: int | None = Field(default=None, gt=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    array_parallelism: int | None = Field(default=None, gt=0)
    ray_address: str | None = Field(default=None, description="Ray cluster (default: local)")
    max_runs: int = Field(
        default=DEFAULT_MAX_RUNS, gt=0, description="grids expanding to more ask for --yes"
    )
    max_retries: int = Field(
        default=1, ge=0, description="resubmissions of a crashed run (preemptions not counted)"
    )


class Geomspace(_Strict):
    """``{geomspace: [start, stop, num], extra: [...]}``: log-spaced budgets plus extra points."""

    geomspace: tuple[float, float, int]
    extra: list[float] = Field(default_factory=list)

    def values(self) -> list[float]:
        start, stop, num = self.geomspace
        if num < 1 or start <= 0 or stop <= 0:
            raise ValueError(f"geomspace needs start, stop > 0 and num >= 1, got {self.geomspace}")
        if num > MAX_GEOMSPACE:
            raise ValueError(f"geomspace num={num} is more than {MAX_GEOMSPACE:,} budgets")
        if num == 1:
            return [start, *self.extra]
        ratio = (stop / start) ** (1.0 / (num - 1))
        return [float(f"{start * ratio**i:.4g}") for i in range(num)] + list(self.extra)


class GridSpec(_Strict):
    """What a grid YAML says (``include`` files are merged before validation)."""

    name: str = Field(description="sweep name; the default sweep folder is sweeps/<name>")
    description: str = ""
    base: dict[str, Any] = Field(
        default_factory=dict, description="partial RunSpec shared by every run"
    )
    axes: dict[str, list[Any] | Geomspace] = Field(
        default_factory=dict,
        description="budget, seed, precision, shape, d_model, or a dotted RunSpec path",
    )
    zip: list[list[str]] = Field(
        default_factory=list, description="groups of axes that advance together"
    )
    filters: Filters = Field(default_factory=Filters)
    launch: LaunchSettings = Field(default_factory=LaunchSettings)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if not SLUG.match(name) or set(name) <= {"."}:
            raise ValueError(
                "must be a slug (letters, digits, '.', '_', '-'; starting with a letter or "
                "digit; at most 100 characters): it names the folder sweeps/<name>"
            )
        return name

    @field_validator("base")
    @classmethod
    def _base_keys(cls, base: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(base) - set(RUNSPEC_FIELDS))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; allowed: {', '.join(RUNSPEC_FIELDS)}")
        for key in SECTIONS:
            if key in base and not isinstance(base[key], dict):
                raise ValueError(f"{key}: expected a mapping, got {base[key]!r}")
        return base


@dataclass
class Expansion:
    """The runs a grid expands to, and how many points the filters dropped."""

    grid: GridSpec
    runs: list[RunSpec]
    dropped: dict[str, int] = field(default_factory=dict)


def load_grid(path: str | Path) -> GridSpec:
    """Read and validate a grid YAML (with includes); raise GridError naming file and key."""
    path = Path(path)
    raw = _read_yaml_with_includes(path, seen=())
    _reject_non_finite(path, raw)
    try:
        return GridSpec.model_validate(raw)
    except ValidationError as err:
        raise GridError(_format_validation(path, err)) from None


def expand_grid(grid: GridSpec, source: str | Path = "<grid>", *, yes: bool = False) -> Expansion:
    """Cross (and zip) the axes over the base, derive steps from budgets, filter, validate.

    A grid crossing to more than ``launch.max_runs`` points is refused unless ``yes``.
    """
    axes = {name: _axis_values(source, name, values) for name, values in grid.axes.items()}
    points = _point_count(axes, grid.zip)
    if points > grid.launch.max_runs and not yes:
        raise GridError(
            f"{source}: the axes cross to {points:,} points (before filters), more than "
            f"launch.max_runs={grid.launch.max_runs:,}; pass --yes to go ahead, or raise "
            "launch.max_runs in the grid"
        )
    runs: dict[str, RunSpec] = {}
    dropped = {"tokens_per_param": 0, "min_steps": 0, "duplicate": 0}
    for point in _points(source, axes, grid.zip):
        spec_dict = copy.deepcopy(grid.base)
        for axis, (index, value) in point.items():
            try:
                _apply_axis(spec_dict, axis, value)
            except ValueError as err:
                raise GridError(f"{source}: axes.{axis}[{index}]: {err}") from None
        spec = _validate_point(source, spec_dict, point)
        steps = None
        if spec.budget is not None:
            try:
                steps, reason = _budget_steps(spec, grid.filters)
            except (ArithmeticError, ValueError) as err:
                where = ", ".join(f"axes.{axis}[{index}]" for axis, (index, _) in point.items())
                raise GridError(
                    f"{source}: {where}: budget {spec.budget:g} gives no usable step count "
                    f"({type(err).__name__}: {err})"
                ) from None
            if reason:
                dropped[reason] += 1
                continue
        spec = spec.resolve(steps)
        if spec.run_id in runs:
            dropped["duplicate"] += 1
            continue
        runs[spec.run_id] = spec
    return Expansion(grid=grid, runs=list(runs.values()), dropped=dropped)


def frozen_grid_text(grid: GridSpec, source: str | Path) -> str:
    """The grid as the sweep folder freezes it (grid.yaml): the top file with its includes
    merged, so what a later command reads (``sweep intervene``: the launch section) is what
    this launch ran with. Folders frozen before hold the top file alone."""
    payload = grid.model_dump(mode="json", exclude_defaults=True)
    header = f"# {source} as launched, includes merged\n"
    return header + yaml.safe_dump(payload, sort_keys=False, allow_unicode=True)


def grid_json_schema() -> dict[str, Any]:
    """JSON Schema of the grid format (for editors), with RunSpec as the base's schema."""
    schema = GridSpec.model_json_schema()
    schema["properties"]["base"] = {"description": "partial RunSpec", **RunSpec.model_json_schema()}
    schema["properties"]["base"].pop("required", None)
    schema["title"] = "mxscale sweep grid"
    return schema


def _read_yaml_with_includes(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise GridError(f"{path}: grid file not found")
    if path.resolve() in seen:
        raise GridError(f"{path}: include cycle through {', '.join(map(str, seen))}")
    try:
        raw = load_untrusted(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise GridError(f"{path}: not valid YAML: {err}") from None
    except YamlBudgetError as err:
        raise GridError(f"{path}: refused: the document {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise GridError(f"{path}: cannot read the grid: {err}") from None
    if not isinstance(raw, dict):
        raise GridError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise GridError(
            f"{path}: include: expected a file name or a list of them, got {includes!r}"
        )
    merged: dict[str, Any] = {}
    for include in includes:
        merged = deep_merge(
            merged, _read_yaml_with_includes(path.parent / include, (*seen, path.resolve()))
        )
    return deep_merge(merged, raw)


def _reject_non_finite(path: Path, raw: Any) -> None:
    """inf/nan anywhere in a grid is a typo (``.inf``); refuse it with its key path."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise GridError(f"{path}: {where or '(top level)'}: {node!r} is not a finite number")
        if isinstance(node, dict):
            stack.extend((f"{where}.{key}" if where else str(key), v) for key, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))


def as_number(value: Any) -> float | None:
    """A finite positive-or-not number from a YAML value, numeric strings (``"1e11"``)
    included; None when it is not one (bools are not numbers)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip().replace("_", ""))
        except ValueError:
            return None
    if not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (mappings merge, others replace)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _axis_values(source: str | Path, name: str, values: list[Any] | Geomspace) -> list[Any]:
    if name not in SPECIAL_AXES and name.split(".")[0] not in RUNSPEC_FIELDS:
        raise GridError(
            f"{source}: axes.{name}: unknown axis; allowed: "
            f"{', '.join(SPECIAL_AXES)} or a dotted RunSpec path "
            f"({', '.join(RUNSPEC_FIELDS)}), e.g. train.lr"
        )
    if isinstance(values, Geomspace):
        if name != "budget":
            raise GridError(f"{source}: axes.{name}: geomspace is only allowed for budget")
        try:
            return values.values()
        except ValueError as err:
            raise GridError(f"{source}: axes.budget: {err}") from None
    if not values:
        raise GridError(f"{source}: axes.{name}: empty list; give at least one value")
    if name == "precision":
        for i, entry in enumerate(values):
            if not isinstance(entry, dict):
                raise GridError(
                    f"{source}: axes.precision[{i}]: expected a mapping like "
                    f"{{w_fmt: fp8_e4m3, a_fmt: bf16}}, got {entry!r}"
                )
            for role in ("w_fmt", "a_fmt", "grad_fmt", "bwd_w_fmt", "bwd_a_fmt"):
                if role in entry and entry[role] not in FORMATS:
                    raise GridError(
                        f"{source}: axes.precision[{i}].{role}: unknown format "
                        f"{entry[role]!r}; allowed: {', '.join(FORMATS)}"
                    )
    if name == "budget":
        numbers = [as_number(value) for value in values]
        for i, (value, number) in enumerate(zip(values, numbers, strict=True)):
            if number is None or number <= 0:
                raise GridError(
                    f"{source}: axes.budget[{i}]: {value!r} is not a positive finite number "
                    "of FLOPs"
                )
        return numbers
    return list(values)


def _point_count(axes: dict[str, list[Any]], zips: list[list[str]]) -> int:
    """How many points the axes cross to (a zipped group counts once; bad zips are
    reported by _points)."""
    zipped = {name for group in zips for name in group}
    count = math.prod(len(values) for name, values in axes.items() if name not in zipped)
    for group in zips:
        count *= min((len(axes[name]) for name in group if name in axes), default=1)
    return count


def _points(source: str | Path, axes: dict[str, list[Any]], zips: list[list[str]]):
    """Yield {axis: (index, value)} for the cross product of unzipped axes and zipped groups."""
    grouped: set[str] = set()
    factors: list[list[dict[str, tuple[int, Any]]]] = []
    for group in zips:
        missing = [name for name in group if name not in axes]
        if missing:
            raise GridError(
                f"{source}: zip: {missing[0]!r} is not an axis; axes: {', '.join(axes)}"
            )
        lengths = {len(axes[name]) for name in group}
        if len(lengths) != 1:
            raise GridError(
                f"{source}: zip: axes {group} have different lengths "
                f"{[len(axes[n]) for n in group]}; zipped axes must match"
            )
        grouped.update(group)
        factors.append([{name: (i, axes[name][i]) for name in group} for i in range(lengths.pop())])
    for name, values in axes.items():
        if name not in grouped:
            factors.append([{name: (i, value)} for i, value in enumerate(values)])
    for combo in itertools.product(*factors):
        point: dict[str, tuple[int, Any]] = {}
        for part in combo:
            point.update(part)
        yield point


def _apply_axis(spec: dict[str, Any], axis: str, value: Any) -> None:
    if axis == "budget":
        spec["budget"] = float(value)
    elif axis == "seed":
        spec["seed"] = value
    elif axis == "d_model":
        spec.setdefault("model", {})["d_model"] = value
    elif axis == "shape":
        shape = {"d_model": value} if isinstance(value, int) else value
        if not isinstance(shape, dict):
            raise ValueError(f"expected a d_model or a mapping like {{d_model: 64}}, got {value!r}")
        spec["model"] = deep_merge(spec.get("model", {}), shape)
    elif axis == "precision":
        entry = dict(value)
        name = entry.pop("name", None)
        spec["precision"] = deep_merge(spec.get("precision", {}), entry)
        if name:
            spec.setdefault("tags", {})["config"] = str(name)
    else:
        node = spec
        *parents, leaf = axis.split(".")
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join(parents[: depth + 1])
                raise ValueError(f"base.{where} is {node!r}, not a mapping this axis can set")
        node[leaf] = value


def _validate_point(
    source: str | Path, spec_dict: dict[str, Any], point: dict[str, tuple[int, Any]]
) -> RunSpec:
    train = spec_dict.setdefault("train", {})
    # Budget runs get their steps later; a placeholder keeps validation of the rest honest.
    if spec_dict.get("budget") is not None:
        train["steps"] = 1
    try:
        spec = RunSpec.model_validate(spec_dict)
    except ValidationError as err:
        where = ", ".join(f"axes.{axis}[{index}]" for axis, (index, _) in point.items())
        raise GridError(_format_validation(source, err, prefix="base/" + where)) from None
    return spec


def _budget_steps(spec: RunSpec, filters: Filters) -> tuple[int, str | None]:
    """The step count a budget run gets, and the filter that drops it (None: kept)."""
    n_params = spec.n_params
    steps = steps_for_budget(spec.budget, n_params, spec.tokens_per_step)
    if steps < filters.min_steps:
        return steps, "min_steps"
    if filters.tokens_per_param is not None:
        lo, hi = filters.tokens_per_param
        ratio = steps * spec.tokens_per_step / n_params
        if not lo < ratio < hi:
            return steps, "tokens_per_param"
    return steps, None


def _format_validation(source: str | Path, err: ValidationError, prefix: str = "") -> str:
    root = RunSpec if prefix else GridSpec
    lines = []
    for issue in err.errors():
        loc, _ = _walk(root, issue["loc"])
        key = ".".join(str(part) for part in loc) or "(top level)"
        value = issue.get("input")
        message = issue["msg"].removeprefix("Value error, ")
        if issue["type"] == "extra_forbidden":
            _, parent = _walk(root, issue["loc"][:-1])
            allowed = list(getattr(parent, "model_fields", {}))
            message = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{source}: {prefix + ': ' if prefix else ''}{key}: {message}{shown}")
    return "\n".join(lines)


def _members(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation allows (unions and Annotated unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _members(arg)]


def _field_model(model: Any, part: Any, tag: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model under field ``part`` of ``model`` and whether ``tag`` (the next loc part)
    is a discriminated union's tag that picked it."""
    field_info = getattr(model, "model_fields", {}).get(part)
    members = _members(getattr(field_info, "annotation", None))
    if len(members) == 1:
        return members[0], False
    for member in members:
        kind = member.model_fields.get("kind")
        if kind is not None and kind.default == tag:
            return member, True
    return None, False


def _walk(root: type[BaseModel], loc: tuple) -> tuple[tuple, type[BaseModel] | None]:
    """Follow ``loc`` from ``root``: the loc as users wrote it (without the tags pydantic
    inserts after discriminated unions, as in model.lm.d_model) and the model it ends at
    (None when it leaves the models)."""
    shown: list[Any] = []
    model: type[BaseModel] | None = root
    i = 0
    while i < len(loc):
        shown.append(loc[i])
        tag = loc[i + 1] if i + 1 < len(loc) else None
        model, tagged = _field_model(model, loc[i], tag) if model else (None, False)
        i += 2 if tagged else 1
    return tuple(shown), model


def total_flops(runs: list[RunSpec]) -> float:
    """Sum of C = 6·N·D over the runs, with D the realised tokens (steps x tokens/step)."""
    return math.fsum(r.flops for r in runs)

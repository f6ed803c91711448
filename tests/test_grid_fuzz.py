"""Random mutations of the shipped grids through `sweep plan`: exit 0 or 2, never a traceback.

Each case mutates one grid 1-3 times (types swapped, bounds broken, keys deleted, unicode,
huge numbers, deep nesting, alias references, raw text damage) and runs the real command
in-process. Axes are first trimmed to 3 values so a case takes milliseconds, not the
second the 1,520-run paper grid needs.
"""

from __future__ import annotations

import copy
import math
import random
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sweep.cli import app

CASES = 300
CASE_LIMIT_S = 10.0
HOSTILE = [
    None,
    True,
    0,
    -1,
    1e308,
    -1e308,
    10**40,
    math.inf,
    math.nan,
    "",
    "1e11",
    "-3e5",
    "abc",
    "名前🙂",
    "\u202e../../x",
    "a\x00b",
    [],
    {},
    [[[]]],
    {"kind": "proxy"},
    {"w_fmt": "fp9"},
]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a node (mapping keys / list indices), the root excluded."""
    out = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _nest(value: Any, depth: int, rng: random.Random) -> Any:
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _mutate(grid: dict, rng: random.Random) -> None:
    """One mutation in place."""
    paths = _paths(grid)
    path = rng.choice(paths)
    parent = grid
    for key in path[:-1]:
        parent = parent[key]
    leaf = path[-1]
    op = rng.choice(["replace", "replace", "delete", "nest", "unknown_key", "repeat", "scale"])
    if op == "replace":
        parent[leaf] = copy.deepcopy(rng.choice(HOSTILE))
    elif op == "delete":
        del parent[leaf]
    elif op == "nest":
        # Deeper documents are built as text (_damage): copying or dumping them would
        # exhaust this test's own stack.
        parent[leaf] = _nest(parent[leaf], rng.choice([3, 20, 70]), rng)
    elif op == "unknown_key" and isinstance(parent, dict):
        parent[rng.choice(["ключ", "🙂", "base", "zip", "x.y", "name"])] = rng.choice(HOSTILE)
    elif op == "repeat" and isinstance(parent[leaf], list):
        parent[leaf] = parent[leaf] * rng.choice([2, 50])
    elif (
        op == "scale"
        and isinstance(parent[leaf], int | float)
        and not isinstance(parent[leaf], bool)
    ):
        parent[leaf] = parent[leaf] * rng.choice([-1, 0, 1e-300, 1e30, 1e300])


def _damage(text: str, rng: random.Random) -> str:
    """Text-level damage a sloppy edit makes: truncation, a stray character, an alias."""
    at = rng.randrange(len(text))
    return rng.choice(
        [
            text[:at],
            text[:at]
            + rng.choice(["{", ":", "\t", "&a", "*a", "- ", "'", "!!python/object:x"])
            + text[at:],
            text.replace("\n", "\n ", 1),
            text + "\nextra: " + "[" * 2000 + "]" * 2000 + "\n",
            text + "\nextra: " + "{a: " * 500 + "1" + "}" * 500 + "\n",
        ]
    )


def _trimmed(path: Path) -> dict:
    grid = yaml.safe_load(path.read_text())
    for name, values in grid.get("axes", {}).items():
        if isinstance(values, list):
            grid["axes"][name] = values[:3]
    return grid


class _Timeout(Exception):
    pass


def _raise_timeout(signum, frame):
    raise _Timeout


def test_random_grid_mutations_exit_0_or_2_quickly(tmp_path: Path, repo_root: Path):
    sources = sorted((repo_root / "grids").glob("*.yaml")) + sorted(
        (repo_root / "tests" / "grids").glob("*.yaml")
    )
    grids = [(path.name, _trimmed(path)) for path in sources]
    rng = random.Random(16)
    runner = CliRunner()
    outcomes = {0: 0, 2: 0}
    slowest = 0.0
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        for case in range(CASES):
            name, original = rng.choice(grids)
            grid = copy.deepcopy(original)
            for _ in range(rng.randint(1, 3)):
                _mutate(grid, rng)
            text = yaml.safe_dump(grid, allow_unicode=True, sort_keys=False)
            if rng.random() < 0.2:
                text = _damage(text, rng)
            path = tmp_path / f"case{case}.yaml"
            path.write_text(text, encoding="utf-8")
            started = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
            try:
                result = runner.invoke(app, ["plan", str(path), "--json"])
            except _Timeout:
                pytest.fail(f"case {case} (from {name}) ran over {CASE_LIMIT_S} s:\n{text[:2000]}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            slowest = max(slowest, time.perf_counter() - started)
            crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
            if crashed or result.exit_code not in (0, 2):
                trace = "".join(traceback.format_exception(result.exception)) if crashed else ""
                pytest.fail(
                    f"case {case} (from {name}) exited {result.exit_code}:\n{trace}"
                    f"{result.output[-2000:]}\n--- grid ---\n{text[:2000]}"
                )
            outcomes[result.exit_code] += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    # The mutations are hostile but not all fatal: both outcomes must be exercised.
    assert outcomes[0] >= 10 and outcomes[2] >= CASES // 2, outcomes
    assert slowest < CASE_LIMIT_S

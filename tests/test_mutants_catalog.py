"""The mutant harness (tests/mutants/) itself: every catalogued mutant still applies to the
code as it is (its line is found exactly once, its tests exist), and a target that moved
or became ambiguous is an error, never a silent skip. The mutants are run by `make mutants`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mutants"))

from catalog import MUTANTS, Mutant  # noqa: E402
from run import MutantError, mutated_text  # noqa: E402


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_applies_to_the_current_code(mutant):
    text = (ROOT / mutant.path).read_text()
    changed = mutated_text(text, mutant)
    diff = [(a, b) for a, b in zip(text.splitlines(), changed.splitlines(), strict=True) if a != b]
    assert len(diff) == 1 and diff[0][1].strip() == mutant.new
    for test in mutant.tests:
        assert (ROOT / test.split("::")[0]).is_file(), test


def test_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))


def mutant(old: str, after: str | None = None) -> Mutant:
    return Mutant("m", "f.py", old, "y = 2", ("t",), "why", after=after)


def test_missing_or_ambiguous_targets_are_errors():
    text = "def f():\n    x = 1\n    x = 1\n    z = 3\n"
    with pytest.raises(MutantError, match="found 0 times"):
        mutated_text(text, mutant("w = 0"))
    with pytest.raises(MutantError, match="found 2 times"):
        mutated_text(text, mutant("x = 1"))
    with pytest.raises(MutantError, match="not found after"):
        mutated_text(text, mutant("x = 1", after="z = 3"))


def test_the_first_match_after_an_anchor_is_replaced_with_its_indentation():
    text = "def f():\n    x = 1\n    z = 3\n    x = 1\n"
    assert mutated_text(text, mutant("x = 1", after="z = 3")).splitlines()[3] == "    y = 2"

"""`make mutants`: apply each one-line mutant of catalog.py to a copy of the repository, run
the tests that concern it there, and require them to fail.

Each mutant gets its own copy (hard links to a base copy, the mutated file rewritten), so
its code is what is imported, by pytest and by every subprocess the tests start (the copy is
the working directory and PYTHONPATH). A mutant whose target line is missing or ambiguous is
an error: a code change moved the line and the catalog must follow it. Prints killed/total;
exits 1 if any mutant survived or could not be applied or run.

    python tests/mutants/run.py [-j JOBS] [--list] [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from catalog import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
    "*.egg-info", "sweeps", "figures", "build",
)  # fmt: skip
TIMEOUT_S = 300


class MutantError(Exception):
    """The mutant could not be applied or its tests did not run."""


def mutated_text(text: str, mutant: Mutant) -> str:
    """``text`` with the mutant's target line replaced (indentation kept)."""
    lines = text.splitlines(keepends=True)
    start = 0
    if mutant.after is not None:
        start = _unique(lines, mutant.after, 0, mutant, "anchor") + 1
    index = (
        _unique(lines, mutant.old, start, mutant, "line")
        if mutant.after is None
        else _first(lines, mutant.old, start, mutant)
    )
    line = lines[index]
    indent = line[: len(line) - len(line.lstrip())]
    lines[index] = indent + mutant.new + "\n"
    return "".join(lines)


def _matches(lines: list[str], target: str, start: int) -> list[int]:
    return [i for i in range(start, len(lines)) if lines[i].strip() == target.strip()]


def _unique(lines: list[str], target: str, start: int, mutant: Mutant, what: str) -> int:
    found = _matches(lines, target, start)
    if len(found) != 1:
        raise MutantError(
            f"{mutant.name}: target {what} {target!r} found {len(found)} times in "
            f"{mutant.path} (needs exactly 1): update tests/mutants/catalog.py"
        )
    return found[0]


def _first(lines: list[str], target: str, start: int, mutant: Mutant) -> int:
    found = _matches(lines, target, start)
    if not found:
        raise MutantError(
            f"{mutant.name}: target line {target!r} not found after {mutant.after!r} in "
            f"{mutant.path}: update tests/mutants/catalog.py"
        )
    return found[0]


def environment(copy: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(copy),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def check_imports_from(copy: Path) -> None:
    """The copy's packages, not the installed ones, are imported (from any directory)."""
    code = (
        "import analysis, models, mx, sweep\n"
        "print(*(m.__file__ for m in (analysis, models, mx, sweep)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=environment(copy), capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    paths = result.stdout.split()
    if result.returncode != 0 or not all(p.startswith(str(copy)) for p in paths):
        raise MutantError(
            f"imports do not come from the copy {copy}: {result.stdout}{result.stderr}"
        )


def run_mutant(mutant: Mutant, base: Path, work: Path) -> tuple[str, str, float]:
    """(outcome, detail, seconds): outcome is killed, survived or error."""
    started = time.monotonic()
    copy = work / mutant.name
    try:
        target = base / mutant.path
        if not target.is_file():
            raise MutantError(f"{mutant.name}: no file {mutant.path}")
        text = mutated_text(target.read_text(), mutant)
        shutil.copytree(base, copy, copy_function=os.link)
        (copy / mutant.path).unlink()  # a hard link: never write through it
        (copy / mutant.path).write_text(text)
        missing = [t for t in mutant.tests if not (copy / t.split("::")[0]).is_file()]
        if missing:
            raise MutantError(f"{mutant.name}: no test file {', '.join(missing)}")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             f"--basetemp={copy / '.pytest-tmp'}", *mutant.tests],
            cwd=copy, env=environment(copy), capture_output=True, text=True,
            timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    except MutantError as err:
        return "error", str(err), time.monotonic() - started
    except subprocess.TimeoutExpired:
        return "killed", f"tests timed out after {TIMEOUT_S} s", time.monotonic() - started
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    seconds = time.monotonic() - started
    if result.returncode == 0:
        return "survived", "its tests passed", seconds
    if result.returncode == 1:
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M)
        return "killed", f"by {failed[0] if failed else '?'}", seconds
    tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
    return "error", f"pytest exited {result.returncode}:\n    " + "\n    ".join(tail), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only these mutants")
    parser.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("MUTANT_JOBS", "2")))
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list:
        for m in chosen:
            print(f"{m.name:32} {m.path}: {m.why}")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        work = Path(tmp)
        base = work / "base"
        shutil.copytree(ROOT, base, ignore=IGNORE)
        check_imports_from(base)
        outcomes = []
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(run_mutant, m, base, work) for m in chosen]
            for mutant, future in zip(chosen, futures, strict=True):
                outcome, detail, seconds = future.result()
                outcomes.append((mutant, outcome))
                print(
                    f"{outcome.upper():9} {mutant.name:36} {seconds:6.1f} s  {detail}", flush=True
                )
    killed = sum(outcome == "killed" for _, outcome in outcomes)
    bad = [m.name for m, outcome in outcomes if outcome != "killed"]
    print(f"{killed}/{len(outcomes)} mutants killed in {time.monotonic() - started:.0f} s")
    if bad:
        print(f"not killed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

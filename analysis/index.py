"""Markdown indexes that show an analysis folder's figures and link its tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def write_index(out_dir: Path, paths: list[Path], title: str, skipped: Sequence[str] = ()) -> Path:
    """Write ``out_dir/index.md`` showing every PNG (with its PDF), linking every table and
    listing what was skipped (and why)."""
    lines = [f"# {title}", ""]
    for png in (p for p in paths if p.suffix == ".png"):
        lines += [f"## {png.stem}", "", f"![{png.stem}]({png.name}) ([PDF]({png.stem}.pdf))", ""]
    tables = [p for p in paths if p.suffix == ".md"]
    if tables:
        lines += ["## Tables", ""]
        lines += [f"- [{p.stem}]({p.name}) ([CSV]({p.stem}.csv))" for p in tables]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {reason}" for reason in skipped]
    index = out_dir / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index


def write_root_index(root: Path) -> Path:
    """Write ``root/index.md`` linking the index of every analysed sub-folder."""
    subs = sorted(p.parent for p in root.glob("*/index.md"))
    if not subs:
        raise ValueError(f"no analysed folders (*/index.md) under {root}")
    lines = ["# Figures and tables", ""] + [f"- [{p.name}]({p.name}/index.md)" for p in subs]
    index = root / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index


if __name__ == "__main__":
    print(write_root_index(Path(sys.argv[1] if len(sys.argv) > 1 else "figures")))

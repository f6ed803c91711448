"""The `sweep` console command (also `python -m sweep`).

`sweep status` is answered before the typer command line is loaded: typer converts every
parameter through pydantic, ~0.4 s of imports, and status must finish within 1 s on a
1,000-run sweep. Every other command goes to sweep.cli.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Dispatch `sweep status` to its fast entry point, everything else to the typer app."""
    if sys.argv[1:2] == ["status"]:
        from sweep.status import main as status_main

        sys.exit(status_main(sys.argv[2:]))
    from sweep.cli import app

    app()


if __name__ == "__main__":
    main()

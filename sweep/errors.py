"""User-facing errors the CLI turns into exit code 2 (kept import-light for fast commands)."""


class GridError(ValueError):
    """A grid file that cannot be used; the message names file, key, value and what is allowed."""


class SweepError(ValueError):
    """A sweep folder that cannot be used as asked (message says why and what to do)."""

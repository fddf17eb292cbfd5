"""``python -m etcdfence``: the same command line as the ``etcdfence`` script."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

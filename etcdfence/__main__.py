"""``python -m etcdfence``: the same command line as the ``etcdfence`` script."""

from __future__ import annotations

from ._early_signals import install as _install_early_signals

_install_early_signals()  # first: a signal during the imports below is recorded, not fatal

from .cli import main  # noqa: E402


def entry() -> int:
    """The ``etcdfence`` script (its handlers were installed on this module's import)."""
    return main()


if __name__ == "__main__":
    raise SystemExit(main())

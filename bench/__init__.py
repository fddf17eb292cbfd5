"""etcdfence's benchmarks: one module a topic, each measuring its contenders side by side.

Run from the checkout's root: ``make bench`` (``python -m bench.run_all``) runs every topic,
each in its own process, then assembles ``bench/REPORT.md``; ``python -m bench.<topic>``
runs one. What a topic module holds and how the report is built: :mod:`bench._common`.
Not part of the installed library (the wheel ships ``etcdfence`` only).
"""

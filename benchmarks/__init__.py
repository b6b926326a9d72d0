"""Benchmark scripts, run from the checkout's root as ``python benchmarks/X.py`` or ``python -m
benchmarks.X``. Each imports its siblings by plain name (``from common import ...``), as a script
run by path finds them; for ``-m`` this package puts its folder on ``sys.path`` the same way."""

import sys

sys.path.insert(0, __path__[0])

"""Benchmark scripts, run from the checkout's root as ``python benchmarks/X.py`` or
``python -m benchmarks.X``; never imported by the library or the tests.

A script imports its siblings by their plain names (``from common import ...``): run as a path,
Python puts the script's folder first on ``sys.path``; run with ``-m``, this package (imported
first) puts the same folder there. One rule for both forms, written once here rather than a
``sys.path`` line in every script.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

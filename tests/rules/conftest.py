"""Lets the tests here import their shared helpers (``recovery_helpers``): pytest runs with
``--import-mode=importlib``, which puts no test folder on ``sys.path``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import sys
from pathlib import Path

# The tests import their helper module `fake_runtime` (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).parent))

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synth import Spec, write_capture  # noqa: E402

from kern_mine.mine import MineOptions, mine  # noqa: E402

# The standard synthetic capture: a warm-up window (64, 17, 3 tokens), then four
# requests (prompts 1, 5, 16, 30; 4 passes each). Pass 5's argmax lands after the
# host pause, pass 9's embed before it (±1 launch boundary jitter).
STANDARD = Spec(prompts=[1, 5, 16, 30], warmup=[64, 17, 3], late_tail={5}, early_head={9})


@pytest.fixture(scope="session")
def standard(tmp_path_factory):
    d = tmp_path_factory.mktemp("standard")
    truth = write_capture(d, STANDARD)
    return d, truth, mine(d)


@pytest.fixture(scope="session")
def degenerate(tmp_path_factory):
    """Only 1- and 2-token passes: prompts of 2 tokens, 2 new tokens each."""
    d = tmp_path_factory.mktemp("degenerate")
    truth = write_capture(d, Spec(prompts=[2, 2, 2], new_tokens=2))
    return d, truth, mine(d, MineOptions(tokens_max=64))

"""Fixtures shared by the GPU tests of this folder (helpers: gpu_helpers.py).

No torch import at module level: without torch, collection must still work (each test module
skips itself then).

- ks: the KernelSet over the requesting module's own `kdir` fixture (every module that uses `ks`
  defines `kdir`, session scoped: what it builds differs per module). Module scope, not session: a
  session-scoped `ks` would be made from the first module's `kdir` and handed to every later module.
- _seed: torch.manual_seed from the test's node id before each test, torch.cuda.synchronize() after.
  Not autouse (test_e2e_qwen3.py never had it): a module opts in with pytest.mark.usefixtures("_seed").
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ks(kdir):
    import torch
    from cubin_launch import KernelSet  # tools/kernels-src: put on sys.path by the test module

    torch.cuda.init()
    torch.empty(1, device="cuda")  # make torch's primary context current
    return KernelSet(kdir)


@pytest.fixture
def _seed(request):
    import torch

    torch.manual_seed(hash(request.node.nodeid) % (2**31))
    yield
    torch.cuda.synchronize()

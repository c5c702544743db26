"""kern-capture: CUPTI injection library that dumps the kernels and launches of any CUDA program.

Reading a capture::

    from kern_capture import Capture, iter_launches
    cap = Capture.open("dump/")
    for launch in cap.launches():
        print(launch.symbol, launch.grid, launch.module_id)

Capturing: ``kern-capture run --out dump/ -- python my_program.py``.
"""

__version__ = "0.2.0"

from kern_capture.checks import CaptureChecks, LaunchChecker  # noqa: E402
from kern_capture.records import (  # noqa: E402
    AllocRange,
    Capture,
    CaptureError,
    CaptureFormatError,
    LaunchRecord,
    ModuleRecord,
    ParamRecord,
    iter_launches,
    iter_modules,
    read_error,
)

__all__ = [
    "AllocRange",
    "Capture",
    "CaptureChecks",
    "CaptureError",
    "CaptureFormatError",
    "LaunchChecker",
    "LaunchRecord",
    "ModuleRecord",
    "ParamRecord",
    "iter_launches",
    "iter_modules",
    "read_error",
    "__version__",
]

"""kern-verify: the verifier for kern manifests.

`verify(manifest, source=None, kernels_dir=None)`, `verify_text`, `verify_path` return
every problem as a `Diagnostic` (stable code, severity, manifest path, line/column,
message, hint); `plan(manifest, capacity_tokens)` computes the memory a load takes;
`kern_verify.cubin` reads cubins' parameter tables without a GPU. CLI: `kern-verify`.
"""

from .codes import CODES, Code, explain
from .cubin import Cubin, CubinError, KernelInfo, ParamSlot, compare_layout, params_from_manifest, read_cubin
from .diagnostic import Diagnostic, Note
from .externs import EXTERNS, Extern
from .plan import Plan, PlanBuffer, PlanError, PlanScratch, PlanState, plan
from .verify import verify, verify_path, verify_text

__version__ = "0.5.1"

__all__ = [
    "CODES", "Code", "explain",
    "Cubin", "CubinError", "KernelInfo", "ParamSlot", "compare_layout", "params_from_manifest", "read_cubin",
    "Diagnostic", "Note", "EXTERNS", "Extern",
    "Plan", "PlanBuffer", "PlanError", "PlanScratch", "PlanState", "plan",
    "verify", "verify_path", "verify_text",
]

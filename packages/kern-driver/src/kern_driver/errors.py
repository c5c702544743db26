"""The one exception type of kern-driver.

Every failure the runtime reports is a `KernDriverError`. Its message is built
from parts so that a caller can also inspect them:

- `what`: the sentence describing the failure;
- `cuda_error`: the CUDA or cuBLASLt status name (`CUDA_ERROR_INVALID_VALUE`,
  `CUBLAS_STATUS_NOT_SUPPORTED`) when a library call failed, else None;
- `where`: the manifest location (`program decode, call l3.qkv_proj (#12),
  launch 0 (module attn, entry attn_fwd)` or a manifest path such as
  `ops.rms_norm.impl.launches[0]`), else None;
- `hint`: how to fix it, else None.

`str(err)` gives `what [cuda_error] at where` followed by `hint: ...`.
"""

from __future__ import annotations


class KernDriverError(RuntimeError):
    """A kern runtime failure. See the module docstring for the attributes."""

    def __init__(
        self,
        what: str,
        *,
        cuda_error: str | None = None,
        where: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.cuda_error = cuda_error
        self.where = where
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        msg = self.what
        if self.cuda_error:
            msg += f" [{self.cuda_error}]"
        if self.where:
            msg += f"\n  at {self.where}"
        if self.hint:
            msg += f"\n  hint: {self.hint}"
        return msg

    def at(self, where: str) -> "KernDriverError":
        """A copy of this error located at `where` (used to add the manifest location to
        an error raised by a lower layer that did not know it)."""
        if self.where:
            where = f"{where}; {self.where}"
        return KernDriverError(self.what, cuda_error=self.cuda_error, where=where, hint=self.hint)


def a_class(cls: str) -> str:
    """A buffer class with its article, for messages: "an `input`", "a `weight`"."""
    return f"{'an' if cls[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} `{cls}`"

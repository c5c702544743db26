"""Each package's `__version__` is its pyproject version, and every dependency of one workspace package on another
is satisfied by the workspace's own version (a bump that forgets the other half fails here, not on a user's
machine)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())


def _project(pkg: Path) -> dict:
    return tomllib.loads((pkg / "pyproject.toml").read_text())["project"]


def _init_version(pkg: Path) -> str:
    (init,) = (pkg / "src").glob("*/__init__.py")
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{init}: no __version__")


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize("pkg", PACKAGES, ids=[p.name for p in PACKAGES])
def test_version_and_workspace_dependencies(pkg):
    proj = _project(pkg)
    assert _init_version(pkg) == proj["version"], f"{pkg.name}: __version__ differs from pyproject.toml"
    versions = {_project(p)["name"]: _project(p)["version"] for p in PACKAGES}
    for dep in proj.get("dependencies", []):
        if not re.match(r"\s*kern-", dep):
            continue
        m = re.fullmatch(r"\s*(kern-[a-z]+)\s*(?:>=\s*([0-9.]+))?\s*", dep.split(";")[0])
        # a workspace dependency in another form (`kern-schema>=0.2,<1`, `~=`) was skipped unchecked
        assert m is not None, f"{pkg.name}: dependency `{dep}` is not NAME or NAME>=X.Y, the forms this test checks"
        name, least = m.groups()
        assert name in versions, f"{pkg.name} depends on {name}, which is not a workspace package"
        if least:
            assert _key(versions[name]) >= _key(least), f"{pkg.name} needs {name}>={least}, the workspace has " \
                                                        f"{versions[name]}"

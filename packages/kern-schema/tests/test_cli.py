"""`kern-schema json-schema` and the committed manifest.schema.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kern_schema.cli import json_schema, main

COMMITTED = Path(__file__).resolve().parent.parent / "manifest.schema.json"


def test_committed_schema_is_the_cli_output():
    assert COMMITTED.read_bytes() == json_schema(), (
        "packages/kern-schema/manifest.schema.json is stale: regenerate it with "
        "`uv run kern-schema json-schema > packages/kern-schema/manifest.schema.json`"
    )


def test_main_prints_the_schema(capsysbinary):
    assert main(["json-schema"]) == 0
    assert capsysbinary.readouterr().out == json_schema()


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "kern_schema.cli", "json-schema"], capture_output=True, check=True)
    assert out.stdout == json_schema()


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_schema_content_is_useful_for_editors():
    schema = json.loads(json_schema())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    defs = schema["$defs"]
    top = defs["Manifest"]
    assert top["required"] == ["schema_version", "model", "vars", "states", "buffers", "modules", "ops", "programs"]
    for name, d in defs.items():
        if d.get("type") == "object" and "properties" in d:
            assert d["additionalProperties"] is False, name  # unknown fields refused everywhere
            assert d.get("description"), name
    assert "bf16" in defs["Buffer"]["properties"]["dtype"]["enum"]
    assert defs["Buffer"]["properties"]["class"]["enum"] == ["input", "output", "weight", "workspace", "carry"]
    assert defs["Module"]["properties"]["sha256"]["anyOf"][0]["pattern"] == "^[0-9a-f]{64}$"
    launch = defs["Launch"]["properties"]
    assert launch["block"]["anyOf"][0]["minItems"] == 3 and launch["block"]["anyOf"][0]["maxItems"] == 3
    assert launch["pdl"]["type"] == "boolean" and launch["pdl"]["default"] is False
    assert "griddepcontrol.wait" in launch["pdl"]["description"]


def test_schema_validates_the_article_fixture_if_jsonschema_is_available():
    jsonschema = pytest.importorskip("jsonschema")
    fixture = json.loads((Path(__file__).parent / "fixtures" / "article.json").read_text())
    jsonschema.validate(fixture, json.loads(json_schema()))

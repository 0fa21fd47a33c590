"""The generated models (metergate.models) read a newer admit's replies: a field they do
not declare decodes and is kept, an enum value they do not know decodes. The tolerance
comes from generator options and the Enum template (scripts/generate.sh); the last test
generates the models without them and watches the same replies fail, so these tests can
fail."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from metergate import models as m

ROOT = Path(__file__).resolve().parents[1]
DOC = Path(os.environ.get("METERGATE_OPENAPI") or ROOT.parents[1] / "internal" / "api" / "openapi.yaml")

TOKEN: dict[str, Any] = {
    "id": "ct_0123456789abcdef", "account": "acme", "org": "acme", "scopes": ["usage:read"], "name": "ops",
    "created_at": "2026-11-02T10:00:00Z", "created_by": "admin-token", "expires_at": "2026-12-02T10:00:00Z",
}
# What a newer admit might send: a field this SDK does not know, at the top and nested, and
# enum values it does not know (a scope, a level) beside known ones.
NEWER_TOKEN = {**TOKEN, "scopes": ["usage:read", "usage:write"], "labels": {"team": "search"}}
NEWER_BLOCKER = {"account": "acme", "level": "project", "unit": "tokens", "weight": 3}


def decodes(models: ModuleType) -> list[str]:
    """The newer replies that a models module fails to decode."""
    failed = []
    for name, data in [("CustomerToken", NEWER_TOKEN), ("Blocker", NEWER_BLOCKER)]:
        try:
            getattr(models, name).model_validate(data)
        except ValidationError:
            failed.append(name)
    return failed


def test_a_field_the_sdk_does_not_know_decodes_and_is_kept() -> None:
    t = m.CustomerToken.model_validate(NEWER_TOKEN)
    assert t.model_extra == {"labels": {"team": "search"}}
    assert t.model_dump(mode="json", exclude_none=True)["labels"] == {"team": "search"}, "kept on the way out"
    reply = m.AdmitRateLimited.model_validate({"decision": "rate_limited", "account": "a", "org": "a",
                                              "blocked_by": NEWER_BLOCKER, "retry_after_ms": 10})
    assert reply.blocked_by.model_extra == {"weight": 3}, "nested models keep theirs too"


def test_an_enum_value_the_sdk_does_not_know_decodes() -> None:
    t = m.CustomerToken.model_validate(NEWER_TOKEN)
    known, new = t.scopes
    assert known is m.CustomerScope.usage_read, "a known value is its member"
    assert isinstance(new, m.CustomerScope) and new == "usage:write" and new.value == "usage:write"
    assert t.model_dump(mode="json")["scopes"] == ["usage:read", "usage:write"], "written back as it came"
    b = m.Blocker.model_validate(NEWER_BLOCKER)
    assert b.level == "project" and b.unit is m.BlockerUnit.tokens


def test_a_reply_that_breaks_the_contract_still_fails() -> None:
    with pytest.raises(ValidationError):
        m.Blocker.model_validate({"account": "acme", "unit": "tokens"})  # level is required
    with pytest.raises(ValidationError):
        m.Blocker.model_validate({**NEWER_BLOCKER, "level": 7})  # an enum is a string


def test_the_models_are_the_documents() -> None:
    """models.py is what scripts/generate.sh makes of the document (CI does the same with
    the document a running admit serves, tests/test_api.py)."""
    r = subprocess.run(["sh", str(ROOT / "scripts" / "generate.sh"), "--check", str(DOC)],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True)
    assert r.returncode == 0, f"models.py is stale: run scripts/generate.sh\n{r.stdout[-3000:]}{r.stderr[-3000:]}"


def test_without_the_tolerance_the_newer_replies_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generates the models without the two tolerance options (extra fields allowed, open
    enums): the replies above no longer decode. This is what the tests above guard."""
    script = (ROOT / "scripts" / "generate.sh").read_text()
    strict = script.replace("--extra-fields allow", "--extra-fields forbid").replace(
        '--custom-template-dir "$here/templates"', "")
    assert strict != script and script.count("--extra-fields allow") == 1
    scripts = tmp_path / "scripts"
    shutil.copytree(ROOT / "scripts", scripts)
    (scripts / "generate.sh").write_text(strict)
    (tmp_path / "src" / "metergate").mkdir(parents=True)
    r = subprocess.run(["sh", str(scripts / "generate.sh"), str(DOC)], env={**os.environ, "PYTHON": sys.executable},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = importlib.util.spec_from_file_location("strict_models", tmp_path / "src" / "metergate" / "models.py")
    assert spec and spec.loader
    strict_models = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "strict_models", strict_models)
    spec.loader.exec_module(strict_models)
    assert decodes(strict_models) == ["CustomerToken", "Blocker"]
    assert decodes(m) == []

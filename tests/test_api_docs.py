"""docs/api.md, the API reference readable as a file, is what ``docs/gen_api.py`` writes now."""

import importlib.util
from pathlib import Path

import zmat

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_is_current():
    text = _generator().render((DOCS / "api_full.md").read_text())
    assert (DOCS / "api.md").read_text() == text, "docs/api.md is out of date: run python docs/gen_api.py"
    assert ":::" not in text and " at 0x" not in text  # no directive or address left


def test_api_md_has_every_public_name_with_its_signature():
    text = (DOCS / "api.md").read_text()
    for name in zmat.__all__:
        assert f"`zmat.{name}" in text or f"zmat.{name}." in text, name
    assert (
        "`zmat.superpose(mobile: torch.Tensor, target: torch.Tensor, return_transform: bool = False)" in text
    )
    assert "`zmat.flows.BoxTransform.fit(cls, T: InternalCoordinateTransform" in text

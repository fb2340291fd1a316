"""The README documents what the code does: its config reference is generated from the model."""

from pathlib import Path

from ftwatch.config.model import config_reference

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_reference_is_current():
    """Every row of the generated reference appears verbatim in the README."""
    text = README.read_text(encoding="utf-8")
    missing = [row for row in config_reference().splitlines() if row.strip() and row not in text]
    assert not missing, "README's configuration reference is stale; regenerate it:\n" + "\n".join(missing[:5])


def test_readme_starts_with_the_two_commands():
    """The first lines give make run and make test."""
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:12])
    assert "make run" in head and "make test" in head

"""`enhydra generate` in a service whose domain.py no longer has the template's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from enhydra.cli.generate import GenerateError, find_project, generate_reaction, generate_saga


def shop_like(root: Path) -> Path:
    """A service laid out as `enhydra new` does, its domain rewritten by hand (no KEY_FIELD)."""
    (root / "pyproject.toml").write_text('[project]\nname = "orders"\n')
    package = root / "orders"
    package.mkdir()
    (package / "domain.py").write_text(
        "from enhydra import Aggregate\n\nCOMMAND_TYPES = ('place',)\n\n"
        "def decide(state, command):\n    return []\n"
    )
    (package / "service.py").write_text(
        "from enhydra import Service\n\nservice = Service('orders', None)\n"
    )
    return root


@pytest.mark.parametrize("kind", ["saga", "reaction"])
def test_a_domain_without_the_template_names_is_refused_before_anything_is_written(
    tmp_path: Path, kind: str
) -> None:
    project = find_project(shop_like(tmp_path))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(GenerateError) as refused:
        if kind == "saga":
            generate_saga(project, "checkout")
        else:
            generate_reaction(project, "reserve", "stock")
    message = str(refused.value)
    assert "KEY_FIELD" in message and "orders/domain.py" in message
    assert "COMMAND_TYPES" not in message  # it is defined
    assert "nothing was written" in message
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before

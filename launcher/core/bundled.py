"""Files launch ships inside its package: the setup playbooks, the ready recipes and the
example inventory. Found with importlib.resources, so a checkout, `pip install .`, a wheel
and pipx all see the same files (nothing is looked up relative to a checkout)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from launcher.core.errors import LauncherError

RECIPE_SUFFIX = ".yml"


def _package_dir(name: str) -> Path:
    found = resources.files("launcher") / name
    # ansible-playbook needs a real folder; a zipped install has none to give.
    if not isinstance(found, Path) or not found.is_dir():
        raise LauncherError(f"launch's bundled {name}/ folder is missing ({found}); reinstall "
                            "launch from its wheel or checkout (unzipped)")
    return found


def playbooks_dir() -> Path:
    """site.yml, ansible.cfg and the roles `launch setup` applies."""
    return _package_dir("playbooks")


def recipes_dir() -> Path:
    return _package_dir("recipes")


def recipe_names() -> list[str]:
    """Names of the bundled recipes (file names without .yml), sorted."""
    return sorted(p.name.removesuffix(RECIPE_SUFFIX)
                  for p in recipes_dir().glob(f"*{RECIPE_SUFFIX}"))


def bundled_recipe(name: str) -> Path | None:
    """The bundled recipe called NAME (with or without .yml), or None."""
    if "/" in name or name.startswith("."):
        return None
    path = recipes_dir() / (name if name.endswith(RECIPE_SUFFIX) else name + RECIPE_SUFFIX)
    return path if path.is_file() else None


@dataclass(frozen=True)
class RecipeHeader:
    """What a recipe's leading comment block says about it: the first sentence, and the
    `launch run ...` line its author wrote to show how it is meant to run."""

    description: str
    usage: str | None


_SENTENCE_END = re.compile(r"\.(\s|$)")


def recipe_header(path: Path) -> RecipeHeader:
    """The header of a recipe file. The bundled recipes open with a comment that says what they
    train where, then a `#   launch run ...` line; anything else gives an empty description."""
    prose, usage, paragraph_done = [], None, False
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("launch run "):
            usage = usage or text
            paragraph_done = True
        elif not text:
            paragraph_done = paragraph_done or bool(prose)
        elif not paragraph_done:
            prose.append(text)
    joined = " ".join(prose)
    end = _SENTENCE_END.search(joined)
    return RecipeHeader(joined[:end.start() + 1] if end else joined, usage)


def example_inventory() -> Path:
    return _package_dir("examples") / "inventory.example.yml"

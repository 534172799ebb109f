"""Files launch ships inside its package: the setup playbooks, the ready recipes and the
example inventory. Found with importlib.resources, so a checkout, `pip install .`, a wheel
and pipx all see the same files (nothing is looked up relative to a checkout)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from launcher.errors import LauncherError

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


def example_inventory() -> Path:
    return _package_dir("examples") / "inventory.example.yml"

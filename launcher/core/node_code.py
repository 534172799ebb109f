"""The code every node of a run gets: launch's node runtime (launch_node/), the bundled trainer
(train/) and launch's measuring workloads (launch_bench/). Found beside the launcher package (a
checkout, or site-packages for an installed wheel), never through the import path, where a
user's own package called `train` (their project being the current folder) would be taken for
launch's. Listed and hashed here once for every backend (SSH uploads the files, Slurm copies
them into the run folder, local runs them in place), so code.json compares across backends;
the SSH preflight hashes what arrived on the node the same way (backends/ssh/preflight.py)."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError

PACKAGES = ("launch_bench", "launch_node", "train")


def code_root() -> Path:
    """The folder holding launcher/ and the PACKAGES."""
    found = resources.files("launcher")
    missing = [] if isinstance(found, Path) else list(PACKAGES)
    missing = missing or [p for p in PACKAGES if not (found.parent / p / "__init__.py").is_file()]
    if missing:
        raise LauncherError(f"launch's node code ({', '.join(p + '/' for p in missing)}) is "
                            f"missing beside {found}; reinstall launch from its wheel or "
                            "checkout (unzipped)")
    return found.parent


def code_files(root: Path) -> list[str]:
    """What every node gets: the PACKAGES' modules, relative to ROOT, sorted."""
    return sorted(str(p.relative_to(root)) for package in PACKAGES
                  for p in (root / package).glob("*.py"))


def controller_files(root: Path) -> list[str]:
    """What a detached run's controller runs besides the node code: launch itself (its Python
    modules; the playbooks, recipes and examples stay behind), relative to ROOT, sorted."""
    return sorted(str(p.relative_to(root)) for p in (root / "launcher").rglob("*.py")
                  if "playbooks" not in p.parts and "__pycache__" not in p.parts)


def content_hash(root: Path, files: list[str]) -> str:
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        digest.update((root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def snapshot(root: Path, dest: Path, files: list[str] | None = None) -> dict[str, Any]:
    """The code (`files`, default the node code) copied into DEST (a run folder every node
    reads); its code.json record, the hash taken of the copy."""
    files = code_files(root) if files is None else files
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((root / rel).read_bytes())
    return {"sha256": content_hash(dest, files), "files": files}

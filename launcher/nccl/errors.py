"""The one error the NCCL parsers raise: which file, and what was expected instead."""

from __future__ import annotations

from launcher.core.errors import LauncherError


class NcclParseError(LauncherError):
    """A file is unreadable, or is not the kind of text it was parsed as."""

    def __init__(self, path: str, why: str):
        self.path, self.why = str(path), why
        super().__init__(f"{self.path}: {why}")

"""Errors a user can cause. The CLI prints them as one message, without a traceback."""

from __future__ import annotations


class LauncherError(Exception):
    """A problem the user can fix. `str(err)` says what is wrong and what to do."""

    exit_code = 2


class RecipeError(LauncherError):
    def __init__(self, path: str, key: str, why: str):
        self.path, self.key, self.why = str(path), key, why
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {why}")


class InventoryError(LauncherError):
    def __init__(self, path: str, host: str | None, why: str):
        self.path, self.host, self.why = str(path), host, why
        where = f"{self.path}: host {host}" if host else str(path)
        super().__init__(f"{where}: {why}")


class NotStarted(LauncherError):
    """The run's nodes could not all be reached or checked before anything started (a
    backend's preflight): nothing was started, nothing made. `launch run --recover` asks
    whether a node's machine is gone, and replaces it."""


class RunFailed(LauncherError):
    """A run started but did not succeed; its logs are kept in the run folder."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1, stop_asked: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        # A signal that asked launch to stop during the run (launcher/execute/supervisor.py
        # Outcome.stop_asked), whatever ended it.
        self.stop_asked = stop_asked

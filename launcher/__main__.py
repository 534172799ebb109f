import sys
from importlib import resources
from pathlib import Path

# `python -m launcher` puts the current folder first on the import path; a user's project there
# may hold a package called `train` (launch's trainer is one too): launch's own packages must
# come from where launcher is installed, unless this is the checkout launch runs from.
installed = Path(str(resources.files("launcher"))).parent
if sys.path and Path(sys.path[0] or ".").resolve() != installed:
    sys.path.pop(0)

from launcher.cli import main  # noqa: E402

raise SystemExit(main())

# Sourced by scripts/demo and scripts/test: make .venv hold what the project needs, quickly
# when it already does. Usage: bootstrap_python <extras>  (extras: "" or "test").
# Environment knobs:
#   PYTHON            interpreter to build .venv from (default: python3, must be >= 3.10)
#   LAUNCH_TORCH      the torch requirement (default: torch==2.13.0; on a GPU machine set it to
#                     the CUDA build you want, e.g. LAUNCH_TORCH='torch==2.13.0' with
#                     LAUNCH_TORCH_INDEX=https://download.pytorch.org/whl/cu128)
#   LAUNCH_TORCH_INDEX  extra index for torch (e.g. https://download.pytorch.org/whl/cpu on a
#                     CPU-only machine elsewhere, to avoid the multi-GB CUDA wheel)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

apt_install() {
  # Installs the Debian packages that are missing; needs root (CI runs as root).
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "missing system packages: ${missing[*]} (install them as root; dependent tests will skip)"
    return 0
  fi
  log "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq </dev/null >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
}

ensure_venv() {
  local python=${PYTHON:-python3}
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    if ! "$python" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      apt_install python3-venv
      "$python" -m venv "$VENV"
    fi
  fi
  "$PY" - <<'PYCHECK'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"launch needs Python >= 3.10, .venv has {sys.version.split()[0]}: remove .venv and set PYTHON")
PYCHECK
}

bootstrap_python() {
  local extras=${1:-}
  ensure_venv
  local torch_req=${LAUNCH_TORCH:-torch==2.13.0}
  local stamp="$VENV/.launch-stamp${extras:+-$extras}"
  local want
  want=$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -c1-16)
  want="$want $torch_req"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  log "installing Python packages into .venv (once; later runs skip this)"
  local index_args=()
  [ -n "${LAUNCH_TORCH_INDEX:-}" ] && index_args=(--extra-index-url "$LAUNCH_TORCH_INDEX")
  "$PY" -m pip install -q --disable-pip-version-check "${index_args[@]}" "$torch_req" </dev/null
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT${extras:+[$extras]}" </dev/null
  echo "$want" > "$stamp"
}

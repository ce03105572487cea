# Shared by the raylocal scripts: the checkout, its .venv (set up on first use) and the head's settings.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
[ -x .venv/bin/ray ] || make -s .venv/.installed
RAY=.venv/bin/ray
# The ports `up` chose (it may pick free ones) are kept here for submit, status and down; variables set by
# the caller win.
STATE="$REPO/runs/raylocal.env"
if [ -f "$STATE" ]; then
  while IFS='=' read -r key value; do
    [ -n "$key" ] && [ -z "${!key:-}" ] && export "$key=$value"
  done < "$STATE"
fi
RAY_PORT="${RAY_PORT:-6379}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
# Each local head gets its own temp dir: its session, logs and sockets (down finds its processes by pid, not here).
RAYLOCAL_TMP="/tmp/raylocal-$RAY_PORT"
DASHBOARD="http://127.0.0.1:$RAY_DASHBOARD_PORT"
# Ray 2.60 heads use token auth (the token is in ~/.ray/auth_token); the CLI must say so.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# Ray's single-machine mode (its default on macOS and Windows): the node's address is 127.0.0.1 instead of the
# machine's network address, so the GCS, raylet, agents, workers and client server listen on 127.0.0.1 only.
# Every process that talks to the head needs it (the head's own processes and jobs inherit it from `up`).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# The head (and so every job's `python`) uses this checkout's virtualenv.
export PATH="$REPO/.venv/bin:$PATH"

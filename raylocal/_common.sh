# Shared by the raylocal scripts: the checkout, its .venv (set up on first use) and the head's settings.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The ports `up` chose (it may pick free ones) and the head's processes are kept here for submit, status and
# down; variables set by the caller win. RAYLOCAL_STATE moves it (a relative path is the caller's).
STATE="${RAYLOCAL_STATE:-$REPO/runs/raylocal.env}"
case "$STATE" in /*) ;; *) STATE="$PWD/$STATE" ;; esac
# Where jobs keep their results (see raylocal/up); a relative path is the caller's too.
case "${GROWPIPE_WORKDIR:-}" in "" | /*) ;; *) export GROWPIPE_WORKDIR="$PWD/$GROWPIPE_WORKDIR" ;; esac
cd "$REPO"
[ -x .venv/bin/ray ] || make -s .venv/.installed
RAY=.venv/bin/ray
# up sets raylocal_new_head: a new head does not take the ports of the one recorded before
if [ -z "${raylocal_new_head:-}" ] && [ -f "$STATE" ]; then
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
# The head (and so every job's `python`) uses this checkout's virtualenv.
export PATH="$REPO/.venv/bin:$PATH"

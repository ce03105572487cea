"""Following a running job: which checkpoint to serve next. A pure decision, tested without Ray or Serve;
`growpipe serve --follow` executes it (deploys the new user_config)."""

from __future__ import annotations

from collections.abc import Sequence


def next_checkpoint(complete: Sequence[str], serving: str | None, refused: set[str]) -> str | None:
    """The checkpoint to load now, or None to keep serving: the newest complete one (`complete` is oldest
    first) unless it is the one served or one already refused (damaged: never tried twice). Older checkpoints
    are never served after a newer one: a refused newest waits for the next."""
    if not complete or complete[-1] == serving or complete[-1] in refused:
        return None
    return complete[-1]

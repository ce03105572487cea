"""Hooks a run calls as it goes (tracking, checkpoints): both the Ray controller and the reference trainer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class RunCallback:
    """Every method is optional. A callback must never raise into the run: errors are its own business."""

    def on_start(self) -> None: ...

    def on_state_change(self, prev: Any, nxt: Any) -> None: ...

    def after_epoch(self, row: dict[str, Any]) -> None: ...

    def on_growth(self, event: dict[str, Any]) -> None: ...

    def on_finish(self, summary: dict[str, Any]) -> None: ...

    def on_final_net(self, net: Any, summary: dict[str, Any]) -> None: ...

    def on_error(self, message: str) -> None: ...

    def close(self) -> Any: ...


def notify(callbacks: Sequence[RunCallback], method: str, *args: Any, say: Callable[[str], None] = print) -> None:
    """Call `method` on every callback; a failing callback is reported and skipped, the run goes on."""
    for cb in callbacks:
        try:
            getattr(cb, method)(*args)
        except Exception as e:  # tracking and other side work must never end a run
            say(f"warn   {type(cb).__name__}.{method} failed ({type(e).__name__}: {str(e)[:160]}); the run goes on")


def run_callbacks(cfg: Any, run_name: str, say: Callable[[str], None]) -> list[RunCallback]:
    """The callbacks a config asks for (MLflow tracking when tracking.mlflow)."""
    if not cfg.tracking.mlflow:
        return []
    from growpipe.tracking import MlflowTracker

    return [MlflowTracker(cfg, run_name, say)]

"""What a run returns to whoever started it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from growpipe.nn.net import GrowableNet


@dataclass
class RunResult:
    """What a run produced: the result JSON, the trained net (when asked for) and the data it read (the
    local engine)."""

    result: dict[str, Any]
    net: GrowableNet | None = None
    bundle: Any = None

    def summary(self) -> dict[str, Any]:
        """The result JSON (see growpipe.report.summarize)."""
        return self.result

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.result["history"]

    @property
    def growth(self) -> list[dict[str, Any]]:
        return self.result["growth"]

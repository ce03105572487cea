"""growpipe: block-wise local learning that grows while it trains, on Ray.

The Python API (growpipe.api): `train`, `grow`, `evaluate`, `load_config`, `RunResult`. Imported on first
use, so `import growpipe` stays light."""

from __future__ import annotations

from typing import Any

from growpipe.version import __version__

__all__ = ["RunResult", "__version__", "evaluate", "grow", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name in ("RunResult", "evaluate", "grow", "load_config", "train"):
        from growpipe import api  # lazy: `import growpipe` stays light (the API imports torch)

        return getattr(api, name)
    raise AttributeError(f"module 'growpipe' has no attribute {name!r}")

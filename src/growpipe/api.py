"""The Python API: what `growpipe train` does, for a program."""

from __future__ import annotations

from collections.abc import Callable

from growpipe.config import RunConfig
from growpipe.loop.loop import RunResult
from growpipe.progress import EpochBar


def train(
    cfg: RunConfig,
    runtime: str = "ray",
    address: str | None = None,
    progress: Callable[[str], None] | None = print,
    keep_net: bool = False,
    bar: EpochBar | None = None,
    resume: str | None = None,
) -> RunResult:
    """Train (and grow) the net `cfg` describes; return its result JSON and, with `keep_net` (always for
    runtime local), the trained net.

    runtime "ray": on a Ray cluster (`address`, $RAY_ADDRESS, else an embedded local Ray), the engine chosen
    by the config (the local-learning pipeline; for method bp GPipe, 1F1B or Ray Train DDP); "local": the
    reference trainer in this process. `resume`: a checkpoint directory to continue from."""
    if runtime == "local":
        from growpipe.local import train_local

        return train_local(cfg, progress, resume=resume)
    if runtime != "ray":
        from growpipe.errors import ConfigError

        raise ConfigError(f"runtime: {runtime!r} is not ray or local")
    if cfg.method == "bp":
        from growpipe.runtime.gpipe import check_bp

        check_bp(cfg)
    from growpipe.runtime.pipeline import Pipeline

    with Pipeline(cfg, address, resume=resume) as p:
        result = p.train(progress, bar=bar)
        return RunResult(result, p.final_net() if keep_net else None)

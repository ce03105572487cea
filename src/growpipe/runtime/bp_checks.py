"""What pipelined BP on Ray (GPipe, 1F1B) needs of a config: checked with everything else before Ray starts
(growpipe.prepare.run_problems) and again by the engines (gpipe.py, async_bp.py)."""

from __future__ import annotations

import math

from growpipe.config import RunConfig


def bp_problems(cfg: RunConfig) -> list[str]:
    """What BP on Ray needs of a config and it lacks, one line each (checked with everything else before Ray
    starts, see growpipe.prepare.check_run)."""
    if cfg.method != "bp":
        return [f"method: pipelined BP trains method bp end to end; got {cfg.method!r}"]
    if cfg.engine() == "1f1b" and cfg.data.limit_train:  # at most this many batches
        why = one_f_one_b_problem(cfg, math.ceil(cfg.data.limit_train / cfg.data.batch_size))
        return [why] if why else []
    return []


def one_f_one_b_problem(cfg: RunConfig, batches: int) -> str | None:
    """1F1B keeps K-1 micro-batches in flight: an epoch must have at least as many batches as stages."""
    if batches < cfg.net.blocks:
        return (f"data.batch_size: an epoch has {batches} batch(es) for {cfg.net.blocks} stages; 1F1B needs at "
                "least one micro-batch per stage in flight: lower data.batch_size or use fewer blocks")  # fmt: skip
    return None

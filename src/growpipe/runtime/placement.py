"""Where stage actors run: their resources, their placement-group bundles and their worker environment."""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from growpipe import envvars
from growpipe.config import RunConfig
from growpipe.errors import PipelineError
from growpipe.runtime import NAMESPACE

STAGE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""glibc malloc settings for stage workers. In a Ray worker glibc keeps serving the multi-MB activation and
gradient buffers of every step with fresh mmaps (about 6,000 page faults per 1280-wide MLP step, 33 ms
instead of 25 ms); a fixed 32 MB mmap threshold and a high trim threshold keep them on the heap (4 faults
per step, 25 ms). Variables already set in the driver's environment win."""


def stage_env() -> dict[str, str]:
    """Environment of a stage worker: the malloc settings above, then the driver's GROWPIPE_* variables."""
    env = {k: os.environ.get(k, v) for k, v in STAGE_MALLOC_ENV.items()}
    env.update(envvars.forwarded())
    return env


def stage_bundle(cfg: RunConfig, cluster_has_gpus: bool) -> dict[str, float]:
    """The resources of one stage actor (and of its placement-group bundle)."""
    gpus = cfg.runtime.gpus_per_stage
    if gpus is None:
        gpus = 1.0 if cluster_has_gpus else 0.0
    bundle = {"CPU": float(cfg.runtime.cpus_per_stage)}
    if gpus:
        bundle["GPU"] = float(gpus)
    return bundle


def reserved_bundles_problem(cfg: RunConfig, bundles: int, first: int) -> str | None:
    """Why a run does not fit the reserved placement group of `bundles` bundles it was given from bundle
    `first` on (None: it fits): it needs one bundle per block it may grow to."""
    have, need = bundles - first, cfg.max_blocks()
    if have >= need:
        return None
    return (
        f"reserved: the placement group has {have} bundle(s) from bundle {first} on, for a run of up to {need} "
        f"blocks (net.blocks plus grow.schedule, or grow.max_blocks); reserve one bundle per block"
    )


def make_stage_pg(cfg: RunConfig, n: int, strategy: str) -> Any:
    """A placement group of n stage bundles, ready within runtime.placement_timeout_s, else a PipelineError
    that says what is short and what to lower."""
    bundle = stage_bundle(cfg, ray.cluster_resources().get("GPU", 0) > 0)
    pg = placement_group([bundle] * n, strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=0.5)
    if not ready:  # ask an autoscaler (KubeRay, the cluster launcher) for the nodes, then wait for them
        _ask_autoscaler([bundle] * n)
        ready, _ = ray.wait([pg.ready()], timeout=cfg.runtime.placement_timeout_s)
        _ask_autoscaler([])
    if not ready:
        remove_placement_group(pg)
        have = ray.available_resources()
        short_gpu = bundle.get("GPU", 0) * n > have.get("GPU", 0)
        fix = "lower runtime.gpus_per_stage" if short_gpu else "lower runtime.cpus_per_stage"
        raise PipelineError(
            f"cannot place {n} stage(s) of {bundle} within runtime.placement_timeout_s="
            f"{cfg.runtime.placement_timeout_s:g}s "
            f"(available: CPU {have.get('CPU', 0):g}, GPU {have.get('GPU', 0):g}); {fix} or add resources"
        )
    return pg


def _ask_autoscaler(bundles: list[dict[str, float]]) -> None:
    """request_resources: an autoscaler starts nodes for `bundles` (empty: withdraw the request); a cluster
    without one ignores it."""
    try:
        from ray.autoscaler.sdk import request_resources  # lazy: about 0.1 s, only when nodes are asked for

        request_resources(bundles=bundles)
    except Exception:  # no autoscaler state (a plain local Ray): nothing to ask
        pass


def in_bundle(actor_cls: Any, cfg: RunConfig, pg: Any, bundle_index: int, **options: Any) -> Any:
    """A stage actor class (already ray.remote) set to run in bundle `bundle_index` of `pg`, with a stage's
    resources and worker environment."""
    b = stage_bundle(cfg, ray.cluster_resources().get("GPU", 0) > 0)
    return actor_cls.options(
        namespace=NAMESPACE,
        num_cpus=b["CPU"],
        num_gpus=b.get("GPU", 0),
        runtime_env={"env_vars": stage_env()},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_index
        ),
        **options,
    )

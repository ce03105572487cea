"""Named actors: a run's stage actors' names, and waiting until an ended actor's name can be taken again."""

from __future__ import annotations

import time

import ray

from growpipe.runtime import NAMESPACE


def stage_actor_name(run_name: str, index: int, launch: int = 0) -> str:
    """The name of the stage actor of block `index` of run `run_name` (in the growpipe namespace): `RUN/stageK`
    for its first actor, `RUN/stageK.N` for the N-th after it (a replacement, a standby started again), so
    that no launch waits for Ray to free the name of the actor it replaces."""
    return f"{run_name}/stage{index}" + (f".{launch}" if launch else "")


def names_free(names: list[str], timeout_s: float = 30.0) -> bool:
    """Wait (up to about `timeout_s` in all) until ended actors' names can be taken again (Ray frees a name
    when it marks the actor dead, which can be before or after its process exits); whether they all are."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            except Exception:  # the GCS did not answer this time: ask again until the deadline
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
    return True

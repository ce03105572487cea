"""A multi-node Ray cluster on one machine (ray.cluster_utils.Cluster: one raylet per node), for the elastic
tests and benchmark: a head with no CPU, so every stage runs on a worker raylet that can be removed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.cluster_utils import Cluster

from growpipe.runtime import NAMESPACE


@contextmanager
def raylet_cluster(workers: int = 2, worker_cpus: int = 1) -> Iterator[Any]:
    """A head with 0 CPUs and `workers` raylets of `worker_cpus` CPUs, this process connected to it; shut down
    on exit (never `ray stop`: that would kill every Ray on the machine)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=worker_cpus)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()

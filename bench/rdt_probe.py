"""Probe Ray Direct Transport (RDT) with gloo on this CPU machine, against the object store.

Run: `python bench/rdt_probe.py` (it starts a child with its own `ray.init(num_cpus=4)` and kills that child by
its process-group id when it does not finish within --timeout seconds).

Parts, each with its own deadline (ray.get(..., timeout=60)):
  driver   - the documented pattern: the driver owns the ref; actor A's method returns a tensor with
             tensor_transport="gloo", the driver passes the ref to actor B.
  actor    - what the pipeline needs: actor A owns the ref (it calls a tensor_transport method on itself and
             passes the ref straight to B), which needs the group known in A's process too.
  regroup  - destroy the group and create one over A, B and a new actor C (the pipeline after growth); with
             `leave` A and B first destroy torch.distributed's default group (what runtime/transport.py does):
             without it Ray 2.60's gloo group fails with "the new group's world size should be less or equal
             to the world size set by init_process_group".
driver and actor print one JSON line per size: the median milliseconds per transfer (call included) over gloo
and over the object store (the tensor as the call's argument or return value). Results: bench/RESULTS.md.

    .venv/bin/python bench/rdt_probe.py --parts driver,actor,regroup,leave --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

SIZES = [1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def child(parts: list[str], repeats: int) -> None:
    import ray
    import torch
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)

    @ray.remote(enable_tensor_transport=True, concurrency_groups={"emit": 1})
    class Peer:
        def __init__(self) -> None:
            torch.set_num_threads(1)
            self.stash: dict[int, torch.Tensor] = {}
            self.tensors: dict[int, torch.Tensor] = {}

        def make(self, nbytes: int) -> int:
            self.tensors[nbytes] = torch.arange(nbytes // 4, dtype=torch.float32)
            return nbytes

        @ray.method(tensor_transport="gloo")
        def produce(self, nbytes: int) -> torch.Tensor:
            return self.tensors[nbytes]

        def produce_plain(self, nbytes: int) -> torch.Tensor:
            return self.tensors[nbytes]

        def consume(self, t: torch.Tensor) -> tuple[int, float]:
            return int(t.numel()), float(t[-1])

        # ---- actor-owned refs -----------------------------------------------------------------------
        def know_group(self, actors: list, name: str) -> None:
            from ray.experimental.collective.collective import RemoteCommunicatorManager
            from ray.experimental.collective.communicator import CommunicatorHandle

            manager = RemoteCommunicatorManager.get()
            for old in manager.get_collective_groups():
                manager.remove_remote_communicator(old.name)
            manager.add_remote_communicator(CommunicatorHandle(actors, name, "GLOO"))

        def leave_world(self) -> bool:
            """Ray's torch gloo group keeps torch.distributed's default group of the first collective group it
            joined; a larger group can only be made after it is gone."""
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
                return True
            return False

        @ray.method(concurrency_group="emit")
        def emit(self, key: int) -> list[torch.Tensor]:
            return [self.stash.pop(key)]

        def send_direct(self, other, nbytes: int, n: int) -> list[float]:
            me = ray.get_runtime_context().current_actor
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                self.stash[i] = self.tensors[nbytes]
                ref = me.emit.options(tensor_transport="gloo").remote(i)
                got = ray.get(other.consume_list.remote(ref), timeout=60)
                times.append(time.perf_counter() - t0)
                assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
            return times

        def send_plain(self, other, nbytes: int, n: int) -> list[float]:
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                got = ray.get(other.consume.remote(self.tensors[nbytes]), timeout=60)
                times.append(time.perf_counter() - t0)
                assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
            return times

        def consume_list(self, ts: list[torch.Tensor]) -> tuple[int, float]:
            return self.consume(ts[0])

    def line(part: str, nbytes: int, direct: list[float], plain: list[float]) -> None:
        d, p = statistics.median(direct), statistics.median(plain)
        print(json.dumps({"part": part, "bytes": nbytes, "gloo_ms": round(d * 1e3, 3),
                          "object_store_ms": round(p * 1e3, 3), "ratio": round(d / p, 2)}), flush=True)  # fmt: skip

    a, b = Peer.remote(), Peer.remote()
    ray.get([x.make.remote(n) for x in (a, b) for n in SIZES], timeout=60)
    t0 = time.perf_counter()
    group = create_collective_group([a, b], backend="gloo")
    print(json.dumps({"part": "group", "create_s": round(time.perf_counter() - t0, 3)}), flush=True)

    if "driver" in parts:
        for nbytes in SIZES:
            direct, plain = [], []
            for _ in range(repeats + 1):  # the first round warms up
                t0 = time.perf_counter()
                got = ray.get(b.consume.remote(a.produce.remote(nbytes)), timeout=60)
                direct.append(time.perf_counter() - t0)
                assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
                t0 = time.perf_counter()
                got = ray.get(b.consume.remote(a.produce_plain.remote(nbytes)), timeout=60)
                plain.append(time.perf_counter() - t0)
                assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
            line("driver", nbytes, direct[1:], plain[1:])

    if "actor" in parts or "regroup" in parts:
        ray.get([x.know_group.remote([a, b], group.name) for x in (a, b)], timeout=60)
    if "actor" in parts:
        for nbytes in SIZES:
            direct = ray.get(a.send_direct.remote(b, nbytes, repeats + 1), timeout=120)[1:]
            plain = ray.get(a.send_plain.remote(b, nbytes, repeats + 1), timeout=120)[1:]
            line("actor", nbytes, direct, plain)

    if "regroup" in parts:
        c = Peer.remote()
        ray.get(c.make.remote(SIZES[0]), timeout=60)
        destroy_collective_group(group)
        if "leave" in parts:
            print(json.dumps({"part": "regroup", "left": ray.get([x.leave_world.remote() for x in (a, b)])}))
        t0 = time.perf_counter()
        group = create_collective_group([a, b, c], backend="gloo")
        print(json.dumps({"part": "regroup", "create_s": round(time.perf_counter() - t0, 3)}), flush=True)
        ray.get([x.know_group.remote([a, b, c], group.name) for x in (a, b, c)], timeout=60)
        got = ray.get(b.send_direct.remote(c, SIZES[0], 2), timeout=60)
        print(json.dumps({"part": "regroup", "b_to_c_ms": round(statistics.median(got) * 1e3, 3)}), flush=True)
    print(json.dumps({"part": "done"}), flush=True)
    ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="driver,actor,regroup")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300.0, help="kill the child after this many seconds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.parts.split(","), args.repeats)
        return 0
    cmd = [sys.executable, __file__, "--child", "--parts", args.parts, "--repeats", str(args.repeats)]
    proc = subprocess.Popen(cmd, start_new_session=True)  # its own process group: killed as one by its id
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(json.dumps({"part": "hang", "killed_after_s": args.timeout, "pid": proc.pid}), flush=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 1


if __name__ == "__main__":
    sys.exit(main())

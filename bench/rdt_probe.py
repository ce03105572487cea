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
driver and actor print one JSON line per size: the median milliseconds per hand-over (calls included) by gloo
(RDT), and through the object store with the tensor as the call's argument or return value as a torch tensor
and as a numpy array, and (actor) as growpipe's Packet (numpy on the wire, copied into a writable tensor on
arrival: the pipeline's object_store path). Run with PYTHONPATH=src. Results: bench/RESULTS.md.

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
from typing import Any

SIZES = [1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def child(parts: list[str], repeats: int) -> None:
    import ray
    import torch
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    from growpipe.nn.packet import Packet

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)

    @ray.remote(enable_tensor_transport=True, concurrency_groups={"emit": 1})
    class Peer:
        def __init__(self) -> None:
            torch.set_num_threads(1)
            self.stash: dict[int, torch.Tensor] = {}
            self.tensors: dict[int, torch.Tensor] = {}
            self.next_key = 0

        def make(self, nbytes: int) -> int:
            self.tensors[nbytes] = torch.arange(nbytes // 4, dtype=torch.float32)
            return nbytes

        @ray.method(tensor_transport="gloo")
        def produce(self, nbytes: int) -> torch.Tensor:
            return self.tensors[nbytes]

        def produce_plain(self, nbytes: int, as_numpy: bool) -> Any:
            return self.tensors[nbytes].numpy() if as_numpy else self.tensors[nbytes]

        def consume(self, t: Any) -> tuple[int, float]:
            return len(t), float(t[-1])

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

        def send(self, other, nbytes: int, how: str) -> float:
            """Seconds for one hand-over to `other` as the pipeline does it (this actor owns the call)."""
            t0 = time.perf_counter()
            if how == "gloo":
                key, self.next_key = self.next_key, self.next_key + 1
                self.stash[key] = self.tensors[nbytes]
                ref = ray.get_runtime_context().current_actor.emit.options(tensor_transport="gloo").remote(key)
                got = ray.get(other.consume_list.remote(ref), timeout=60)
            elif how == "packet":
                got = ray.get(other.consume_packets.remote([Packet(x=self.tensors[nbytes])]), timeout=60)
            else:
                t = self.tensors[nbytes]
                got = ray.get(other.consume.remote(t.numpy() if how == "numpy" else t), timeout=60)
            assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
            return time.perf_counter() - t0

        def consume_list(self, ts: list[torch.Tensor]) -> tuple[int, float]:
            return self.consume(ts[0])

        def consume_packets(self, packets: list[Packet]) -> tuple[int, float]:
            return self.consume(packets[0].x)

    def line(part: str, nbytes: int, times: dict[str, list[float]]) -> None:
        ms = {f"{k}_ms": round(statistics.median(v[1:]) * 1e3, 3) for k, v in times.items()}  # [0]: warm-up
        print(json.dumps({"part": part, "bytes": nbytes, **ms}), flush=True)

    a, b = Peer.remote(), Peer.remote()
    ray.get([x.make.remote(n) for x in (a, b) for n in SIZES], timeout=60)
    t0 = time.perf_counter()
    group = create_collective_group([a, b], backend="gloo")
    print(json.dumps({"part": "group", "create_s": round(time.perf_counter() - t0, 3)}), flush=True)

    # gloo (RDT); the object store with a torch tensor, a numpy array, a growpipe Packet (numpy, copied on arrival)
    ways = ("gloo", "torch", "numpy", "packet")
    if "driver" in parts:
        for nbytes in SIZES:
            times: dict[str, list[float]] = {w: [] for w in ways[:3]}
            for _ in range(repeats + 1):  # interleaved: every way sees the same load
                for w in ways[:3]:
                    t0 = time.perf_counter()
                    ref = a.produce.remote(nbytes) if w == "gloo" else a.produce_plain.remote(nbytes, w != "torch")
                    got = ray.get(b.consume.remote(ref), timeout=60)
                    times[w].append(time.perf_counter() - t0)
                    assert got == (nbytes // 4, float(nbytes // 4 - 1)), got
            line("driver", nbytes, times)

    if "actor" in parts or "regroup" in parts:
        ray.get([x.know_group.remote([a, b], group.name) for x in (a, b)], timeout=60)
    if "actor" in parts:
        for nbytes in SIZES:
            times = {w: [] for w in ways}
            for _ in range(repeats + 1):
                for w in ways:
                    times[w].append(ray.get(a.send.remote(b, nbytes, w), timeout=120))
            line("actor", nbytes, times)

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
        got = [ray.get(x.send.remote(y, SIZES[0], "gloo"), timeout=60) for x, y in ((b, c), (a, b))]
        print(json.dumps({"part": "regroup", "b_to_c_then_a_to_b_ms": [round(t * 1e3, 3) for t in got]}), flush=True)
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

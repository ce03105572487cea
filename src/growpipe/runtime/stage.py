"""Stage: hosts one block and its optimizer in a Ray actor and streams packets to the next stage.

A packet arrives by a direct actor call from the previous stage (`push`), is trained on, and its detached
output is pushed on with `next_stage.push.remote(...)`: the driver and controller never touch batches.
Each stage keeps at most `window` packets in flight downstream; when the window is full it waits for the
oldest call (backpressure), so a slow stage slows its producer instead of filling the object store.
`packets_per_call` packets travel in one call to amortise the per-call cost.

Stage is a plain class (testable without Ray); the controller applies `ray.remote` when it launches it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import ray

from growpipe import faults
from growpipe.config import RunConfig
from growpipe.data import iterate_batches
from growpipe.errors import NonFiniteError, StageError, StageLostError
from growpipe.loop.stats import StageStats
from growpipe.nn.block import Block
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.clocks import BOOT_ID, clock_offset
from growpipe.runtime.prefix_cache import PrefixCache
from growpipe.runtime.stage_base import StageBase, peak_rss_mb
from growpipe.runtime.transport import DirectEndpoint


class Stage(StageBase, DirectEndpoint):
    """One block in its own actor: trains on packets from upstream and pushes its output downstream (its
    tensors by a direct transport when the engine put the stages in a group, see runtime/transport.py)."""

    CONCURRENCY_GROUPS = {"control": 1, **DirectEndpoint.CONCURRENCY_GROUPS, **StageBase.CONCURRENCY_GROUPS}
    """position() and request_pause() answer while run_epoch is busy (and a checkpoint's shard is written)."""

    def __init__(self, index: int, cfg: RunConfig):
        super().__init__(index, cfg)
        self.window = cfg.pipeline.window
        self.group = cfg.pipeline.packets_per_call
        self.timeout_s = cfg.runtime.stage_timeout_s
        self.staged: dict[int, Block] = {}  # packed blocks built, not attached yet
        self.downstream: Any = None
        self.clock_offset = 0.0  # how far the next stage's clock is ahead of this one's (another machine)
        self.inflight: deque[tuple[Any, int]] = deque()  # (call ref, packets in it)
        self.inflight_packets = 0
        self.pending: list[Packet] = []  # outputs not sent yet (fewer than packets_per_call)
        self.recording = False
        self.stats = StageStats(index)
        self.last_end: float | None = None  # when the previous packet was done (within one flush)
        self.packets_seen = 0
        self._pause = threading.Event()
        self._pause_lock = threading.Lock()
        self._call = 0  # the running (or last) run_epoch call, as the engine numbers them
        self._pause_for = -1  # the call a pause was asked for
        self._position = (0, 0)  # (batches done, batches in the epoch) of the running run_epoch
        self.cache: PrefixCache | None = None
        self._sending_cache = False  # what goes downstream now is a cache pass, not training
        self._cg_batches: Iterator[Packet] | None = None  # pipeline.transport compiled: the epoch's batches
        faults.check_stage_values()  # a malformed fault variable fails the stage here, at its start

    # ---- control ------------------------------------------------------------------------------------

    def setup(self, spec: BlockSpec, info: InputInfo) -> str:
        """Build this stage's block (same seed as the reference trainer). A stage that has its block already
        builds the new one to run after it, in the same actor (packing), once `attach_packed` is called."""
        block = self._build(spec, info)
        if self.block is None:
            self.block = block
        else:
            self.staged[block.index] = block
        return type(block).__name__

    def attach_packed(self, index: int) -> None:
        """From the next packet on, a staged block trains on this stage's output (after the packed ones)."""
        self.packed.append(self.staged.pop(index))

    def drop_staged(self, index: int) -> None:
        """Forget a staged block that will not be attached."""
        self.staged.pop(index, None)

    def set_downstream(self, handle: Any) -> None:
        """The next stage's actor handle (None for the last stage); on another machine, how far its clock is
        ahead of this one's (a packet is stamped in the receiver's clock)."""
        self.downstream = handle
        self.clock_offset = clock_offset(handle, self.timeout_s) if handle is not None else 0.0

    @ray.method(concurrency_group="control")
    def clock(self) -> tuple[str, float]:
        """This actor's machine (one clock per running kernel) and its time now (see runtime/clocks.py)."""
        return BOOT_ID, time.time()

    # ---- the per-batch path -------------------------------------------------------------------------
    def run_epoch(
        self, epoch: int, side_groups: tuple[str, ...], start_batch: int = 0, stop_at: int | None = None, call: int = 0
    ) -> tuple[StageStats, int | None]:
        """The source stage (stage 0 with the data, or the one holding the prefix cache): stream one
        epoch of training batches (from `start_batch` on, stopping before batch `stop_at`) through the pipeline.

        Returns this stage's stats and `paused_at`: the batch it stopped before when `request_pause` came (for
        this `call`: the engine's number of it) or `stop_at` was reached (None when the epoch ran to its end).
        Everything sent before has been taken downstream.
        """
        batches = self._epoch_batches(epoch, side_groups, start_batch)
        paused_at = None
        with self._pause_lock:
            self._call = call
            if self._pause_for != call:  # one asked for an earlier call (after it ended) is moot; this call's
                self._pause.clear()  # may have come first: request_pause runs in its own concurrency group
        while True:
            t0 = time.perf_counter()
            p = next(batches, None)
            self.stats.wait_input_s += time.perf_counter() - t0
            if p is None:
                break
            faults.hold_before(epoch, p.index, self._pause)  # GROWPIPE_HOLD_AT
            if self._pause.is_set() or (stop_at is not None and p.index >= stop_at):
                paused_at = p.index
                break
            self._process(p.to(self.device))
            self._position = (p.index + 1, self._position[1])
        with self._pause_lock:
            self._pause.clear()
            self._pause_for = -1
        return self.flush(), paused_at

    @ray.method(concurrency_group="control")
    def position(self) -> tuple[int, int]:
        """(batches done, batches in the epoch) of the epoch this source stage streams (for progress bars)."""
        return self._position

    @ray.method(concurrency_group="control")
    def request_pause(self, call: int | None = None) -> None:
        """The source stage: stop run_epoch call `call` (None: the running one) before its next batch (answered
        while run_epoch is busy, and kept when it comes before that call starts)."""
        with self._pause_lock:
            call = self._call if call is None else call
            if call >= self._call:
                self._pause_for = call
                self._pause.set()

    def _epoch_batches(self, epoch: int, side_groups: tuple[str, ...], start_batch: int) -> Iterator[Packet]:
        """The source stage's training batches of `epoch` from `start_batch` on (from the data, or the prefix
        cache); sets the position to the epoch's start."""
        bs, seed = self.cfg.data.batch_size, self.cfg.seed
        n = self.cache.n if self.cache is not None else len(self._data().train)
        self._position = (start_batch, math.ceil(n / bs))
        if self.cache is not None:
            return self.cache.packets(bs, seed, epoch, start_batch)
        return iterate_batches(self._data().train, bs, shuffle=True, seed=seed, epoch=epoch, side_groups=side_groups,
                               start_batch=start_batch, augment=True)  # fmt: skip

    # ---- pipeline.transport compiled: the graph's methods (runtime/compiled.py) -------------------------
    def cg_begin(self, epoch: int, side_groups: tuple[str, ...], start_batch: int = 0) -> int:
        """The source stage: the next "train" jobs take this epoch's batches from `start_batch` on, in order;
        the number of batches in the epoch."""
        self._cg_batches = self._epoch_batches(epoch, side_groups, start_batch)
        return self._position[1]

    def cg_first(self, job: tuple[Any, ...], last: bool) -> Any:
        """The source stage: the job's batch through this stage's blocks (see cg_next for what it returns)."""
        if job[0] == "train":
            p = next(self._cg_batches, None) if self._cg_batches is not None else None
            if p is None or p.index != job[1]:
                got = "nothing" if p is None else f"batch {p.index}"
                raise StageError(f"stage {self.index}: a compiled job asked for batch {job[1]}, the epoch gives {got}")
            out: Packet | None = self._train(p.to(self.device))
            self._position = (p.index + 1, self._position[1])
        else:
            _, split, b, side_groups, threshold, depth = job
            out = self.eval_source(split, b, side_groups, threshold, depth)
        return self._cg_answer(job, out, last)

    def cg_next(self, item: tuple[tuple[Any, ...], Packet | None, float], last: bool) -> Any:
        """A later stage: the packet through this stage's blocks; (job, output, sent at) for the next stage,
        or only the batch index when this stage is the graph's last."""
        job, p, sent_at = item
        if job[0] == "train":
            assert p is not None, "a training step always hands on a packet"
            self._arrived(sent_at)
            out: Packet | None = self._train(p.to(self.device))
            self.last_end = time.time()
        else:
            out = self.eval_packet(p, job[4], job[5])
        return self._cg_answer(job, out, last)

    def _arrived(self, sent_at: float) -> None:
        """A packet sent at `sent_at` starts now: its hop and the wait since the previous one (both in this
        actor's clock: the sender stamped sent_at in it)."""
        start = time.time()
        if self.last_end is not None:
            self.stats.hops_ms.append((start - max(sent_at, self.last_end)) * 1000.0)
            self.stats.wait_input_s += start - self.last_end

    def _cg_answer(self, job: tuple[Any, ...], out: Packet | None, last: bool) -> Any:
        """What a compiled step returns: the job, its output and when it was sent (in the next stage's clock),
        or the batch index alone from the graph's last stage."""
        if last:
            return job[2 if job[0] == "eval" else 1]
        if job[0] == "train" and out is not None:
            self.stats.sent_bytes += out.nbytes
        return job, out, time.time() + self.clock_offset

    def push(self, packets: list[Any], sent_at: float, cache_pass: bool = False, tensors: Any = None) -> None:
        """Called by the previous stage with its next packets; trains on each and passes the outputs on.

        In a cache pass the stage filling its cache stores the packets; a frozen stage forwards them. With a
        direct transport `packets` are their layouts and `tensors` came by it."""
        packets = self.received(packets, tensors)
        if cache_pass:
            self._take_cache_packets(packets)
            return
        self._arrived(sent_at)
        for p in packets:
            self._process(p.to(self.device))

    def flush(self) -> StageStats:
        """Wait until everything sent downstream has been taken; return and reset this stage's stats."""
        t0 = time.perf_counter()
        if self.pending:
            self._send()
        while self.inflight:
            self._wait_oldest()
        self.stats.blocked_s += time.perf_counter() - t0
        out = self.stats
        out.block = type(self.block).__name__ if self.block else "?"
        out.node, out.device = ray.get_runtime_context().get_node_id(), str(self.device)
        out.peak_rss_mb = peak_rss_mb()
        self.stats = StageStats(self.index)
        self.last_end = None
        self.recording = False
        self._sending_cache = False
        return out

    def start_recording(self) -> None:
        """Record a timeline of the next packets (until the next flush)."""
        self.recording = True

    def _process(self, p: Packet) -> None:
        """Train on `p` and queue the output for the next stage (push transports)."""
        out = self._train(p)
        if self.downstream is not None:
            self._queue(out)
        self.last_end = time.time()

    def _train(self, p: Packet) -> Packet:
        """One training step of this stage's blocks on `p` (its own, then the packed ones); the output."""
        block = self._require_block()
        self.packets_seen += 1
        t0 = time.time()
        current = block  # the block training now (its own, or one packed after it)
        try:
            faults.maybe_crash(self.index, self.packets_seen)  # GROWPIPE_FAULT_AT
            out, metrics = block.train_step(p)
            metrics = {f"b{block.index}.{k}": v for k, v in metrics.items()}
            for extra in self.packed:  # blocks packed into this actor train on its output, in order
                current = extra
                out, more = extra.train_step(out)
                metrics.update({f"b{extra.index}.{k}": v for k, v in more.items()})
            faults.step_delay()  # GROWPIPE_STEP_DELAY_MS
        except NonFiniteError as e:  # the block knew the batch, the loop adds the epoch
            raise e.located(where=f"stage {self.index} (block {current.index}, {type(current).__name__})") from None
        except Exception as e:  # any failure of the block, reported with the stage that hit it
            raise StageError(
                f"stage {self.index} (block {block.index}, {type(block).__name__}) failed: {type(e).__name__}: {e}"
            ) from None
        t1 = time.time()
        st = self.stats
        st.busy_s += t1 - t0
        st.samples += p.batch_size
        st.batches += 1
        st.add_losses(metrics)
        if self.recording:
            st.events.append(_event("train_step", self.index, t0, t1, {"batch": p.index}))
        return out

    def _send(self) -> None:
        """Hand the pending packets to the next stage in one call, first waiting for room in the window."""
        group, self.pending = self.pending, []
        self._reap_done()
        t0 = time.time()
        while self.inflight and self.inflight_packets + len(group) > self.window:
            self._wait_oldest()
        t1 = time.time()
        self.stats.blocked_s += t1 - t0
        if self.recording and t1 - t0 > 1e-4:
            self.stats.events.append(_event("blocked_downstream", self.index, t0, t1))
        sent_at = time.time() + self.clock_offset  # in the receiver's clock
        self.inflight.append((self.push_downstream(self.downstream, group, sent_at, self._sending_cache), len(group)))
        self.stats.sent_bytes += sum(p.nbytes for p in group)
        self.inflight_packets += len(group)
        self.stats.max_inflight = max(self.stats.max_inflight, self.inflight_packets)

    def _reap_done(self) -> None:
        """Forget calls downstream that already finished (in order), surfacing their errors now."""
        if not self.inflight:
            return
        refs = [ref for ref, _ in self.inflight]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        done_set = set(done)
        while self.inflight and self.inflight[0][0] in done_set:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        oldest, n = self.inflight[0]
        ready, _ = ray.wait([oldest], num_returns=1, timeout=self.timeout_s, fetch_local=False)
        if not ready:
            raise StageError(
                f"stage {self.index + 1} (or a stage after it) took more than runtime.stage_timeout_s="
                f"{self.timeout_s:g}s for one packet; raise it if steps are that slow"
            )
        self.inflight.popleft()
        self.inflight_packets -= n
        try:
            ray.get(oldest)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, StageError):
                raise cause from None
            raise StageError(f"stage {self.index + 1} failed: {cause or e}") from None
        except ray.exceptions.RayActorError as e:
            reason = str(e).splitlines()[0]
            raise StageLostError(f"stage {self.index + 1} died ({reason})") from None

    # ---- the frozen-prefix cache ----------------------------------------------------------------------

    def start_cache(self, n: int) -> None:
        """Get ready to store the frozen prefix's output for `n` samples (then train from it)."""
        c = self.cfg.grow.cache
        self.drop_cache()
        self.cache = PrefixCache(n, c.max_memory_mb, c.spill, c.spill_dir)

    def cache_pass(self, side_groups: tuple[str, ...]) -> int:
        """Stage 0: send every training sample, in order, through the frozen stages to the cache holder."""
        block = self._require_block()
        self._sending_cache = True
        n = 0
        for p in iterate_batches(self._data().train, self.cfg.data.batch_size, shuffle=False,
                                 side_groups=side_groups):  # fmt: skip
            self._queue(block.forward(p.to(self.device)))
            n += p.batch_size
        self.flush()
        return n

    def cache_info(self) -> str:
        """Where the filled cache lives; StageError when it is not complete."""
        if self.cache is None or not self.cache.complete:
            have = f"{self.cache.filled} of {self.cache.n}" if self.cache else "no"
            raise StageError(f"stage {self.index}: the cache pass left {have} samples in the cache")
        return self.cache.describe()

    def drop_cache(self) -> None:
        """Forget the cache (another stage trains from the data or a newer cache now)."""
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def _take_cache_packets(self, packets: list[Packet]) -> None:
        if self.cache is not None and not self.cache.complete:
            for p in packets:
                self.cache.append(p)
            return
        block = self._require_block()
        if not block.frozen:
            raise StageError(f"stage {self.index}: a cache pass reached a block that still learns")
        self._sending_cache = True
        for p in packets:
            out = block.forward(p.to(self.device))
            for extra in self.packed:
                out = extra.forward(out)
            self._queue(out)

    def _queue(self, out: Packet) -> None:
        if self.downstream is None:
            raise StageError(f"stage {self.index}: a cache pass reached the last stage without a cache")
        self.pending.append(out)
        if len(self.pending) >= self.group:
            self._send()


def _event(name: str, stage: int, t0: float, t1: float, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Chrome-trace complete event (microseconds), one track per stage."""
    ev = {"name": name, "ph": "X", "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6, "pid": 0, "tid": stage}
    if args:
        ev["args"] = args
    return ev

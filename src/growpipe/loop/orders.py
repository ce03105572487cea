"""Grow requests between a caller's thread and the run loop."""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from growpipe.config import GrowRequest, GrowStep, RunConfig, parse_grow_request
from growpipe.errors import ConfigError, GrowpipeError, ShapeError, describe
from growpipe.growth import grow_refusal
from growpipe.loop.engine import Engine, Pause, Prepared
from growpipe.nn.backbones import output_shape
from growpipe.nn.specs import BlockSpec, InputInfo

MORE_BLOCKS_HINT = "for more blocks, start or resume the run with --set grow.max_blocks=N"


class RunState(Protocol):
    """What a request reads of the run's state (growpipe.loop.states.State)."""

    @property
    def name(self) -> str: ...

    @property
    def terminal(self) -> bool: ...


class GrowingRun(Protocol):
    """What the requests read of the run they grow (RunLoop)."""

    @property
    def state(self) -> RunState: ...

    info: InputInfo | None
    specs: list[BlockSpec]

    def next_spec(self, step: GrowStep, request: bool = False) -> BlockSpec: ...


class GrowOrder:
    """One grow request between the caller's thread (waiting on `done`) and the controller's run loop."""

    def __init__(self, ask: GrowRequest):
        self.ask = ask
        self.prepared: Any = None  # the placed and built block (growpipe.loop.engine.Prepared), once prepared
        self.answer: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self.accepted = time.monotonic()
        self.placed_s: float | None = None  # from acceptance until the block was placed and built

    def succeed(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.done.set()

    def fail(self, error: str) -> None:
        self.error = error
        self.done.set()


def check_input_size(ask: GrowRequest, info: InputInfo, last: BlockSpec) -> None:
    """Raise ShapeError when the request names an input size the last block does not produce."""
    if ask.input_size is None:
        return
    shape, _ = output_shape(last.encoder, info)
    features = math.prod(shape)
    if ask.input_size != features:
        raise ShapeError(
            f"grow request: input_size {ask.input_size} does not match block {last.index}'s output "
            f"{tuple(shape)} = {features} features; drop input_size or use {features}"
        )


class GrowRequests:
    """The grow requests of one run: accepted from any thread (validated, counted against grow.max_blocks),
    queued, placed and built, then attached by the loop between two batches or at an epoch boundary; each caller
    is answered once.

    While an epoch runs (`pausing`), an engine that places while training has a request's block placed in a
    thread of its own the moment the request arrives (or the epoch starts), and the epoch's Pause is set once
    the block is ready; otherwise the block is placed between two batches, on the loop's thread (Pause.check)."""

    def __init__(self, cfg: RunConfig, engine: Engine, run_name: str, say: Callable[[str], None]):
        self.cfg, self.engine, self.run_name, self.say = cfg, engine, run_name, say
        self.orders: queue.Queue[GrowOrder] = queue.Queue()
        self.pending = 0  # accepted and not answered yet (queued or being placed)
        self.prepared: GrowOrder | None = None  # placed while an epoch ran, waiting for the pause
        self._placing: tuple[GrowOrder, threading.Thread] | None = None
        self._placing_error: BaseException | None = None
        self._pause: Pause | None = None  # the running epoch's, while one runs
        self._lock = threading.Lock()
        self.closed: str | None = None
        """Why no request is taken any more (the run ends or is being stopped): set, and the queue drained,
        under `_lock` (close), so no request is queued after it."""

    def submit(self, request: dict[str, Any], run: GrowingRun) -> dict[str, Any]:
        """A caller's request (blocks until its block is attached or refused): what was added, or
        {'error': message}. A bad request never disturbs the run."""
        try:
            ask = parse_grow_request(request)
            self.cfg.check_feature_group(ask.as_step(), "group")
        except (ConfigError, ValueError) as e:
            return {"error": str(e)}
        with self._lock:
            if self.closed is not None:  # stopping or ended: nothing is placed, the run ends as it is
                return {"error": self.closed}
            if run.state.terminal:
                return {"error": f"run {self.run_name!r} has {run.state.name}; nothing to grow"}
            if why := grow_refusal(self.run_name, len(run.specs), self.pending, self.cfg.max_blocks()):
                return {"error": f"{why}; {MORE_BLOCKS_HINT}"}
            if run.info is not None and run.specs:
                try:  # fail fast; checked again against the block it really lands on
                    check_input_size(ask, run.info, run.specs[-1])
                except ShapeError as e:
                    return {"error": str(e)}
            order = GrowOrder(ask)
            self.pending += 1
            self.orders.put(order)
        self._place_next(run)  # at once while an epoch runs: no batch boundary waited for
        order.done.wait()
        return order.answer if order.answer is not None else {"error": order.error}

    @contextlib.contextmanager
    def pausing(self, run: GrowingRun) -> Iterator[Pause]:
        """The Pause of one `run_epoch` call: set once a request's block is ready to attach (or its placement
        failed: the loop raises that failure after the call, see `collect`)."""
        places = self.engine.places_while_training
        pause = Pause(None if places else lambda: self._between_batches(run))
        with self._lock:
            self._pause = pause
            ready = self.prepared is not None or self._placing_error is not None  # placed after the last epoch
        if ready:
            pause.set()
        self._place_next(run)
        try:
            yield pause
        finally:
            with self._lock:
                self._pause = None

    def _between_batches(self, run: GrowingRun) -> bool:
        """An engine that cannot place while training, between two batches: place a waiting request's block
        here, on the loop's thread; True once one is ready to attach."""
        if self.prepared is None and (order := self.next_order()) is not None and self.prepare(order, run):
            self.prepared = order
        return self.prepared is not None

    def next_order(self) -> GrowOrder | None:
        """The next waiting request, now the caller's to prepare (None: none waits, or the requests are closed)."""
        with self._lock:
            if self.closed is not None or self.orders.empty():
                return None
            return self.orders.get_nowait()

    def _place_next(self, run: GrowingRun) -> None:
        """While an epoch runs on an engine that places while training: place the next waiting request's block
        in a thread of its own, unless one is being placed or waits for the pause."""
        if not self.engine.places_while_training:
            return
        with self._lock:
            busy = self.prepared is not None or self._placing is not None
            if self._pause is None or busy or self.closed is not None or self.orders.empty():
                return
            order = self.orders.get()
            thread = threading.Thread(target=self._place, args=(order, run), name="growpipe-place", daemon=True)
            self._placing = (order, thread)
        thread.start()

    def _place(self, order: GrowOrder, run: GrowingRun) -> None:
        """The placing thread: on success the block waits for the pause, which is set now; a refused request
        makes room for the next one; a failure (a worker lost) is raised on the loop's thread after the epoch."""
        error: BaseException | None = None
        try:
            placed = self.prepare(order, run)
        except BaseException as e:
            placed, error = False, e
        with self._lock:
            self._placing = None
            if error is not None:
                self._placing_error = error
            if placed:
                self.prepared = order
            pause = self._pause
        if placed or error is not None:
            if pause is not None:
                pause.set()
        else:
            self._place_next(run)

    def take_prepared(self) -> GrowOrder | None:
        """The request ready to attach (placed during an epoch), now the loop's to attach."""
        with self._lock:
            order, self.prepared = self.prepared, None
        return order

    def collect(self, wait: bool) -> None:
        """Raise a placement's failure here, on the loop's thread (with `wait`: once the running placement ended).
        A placed block is the one to attach already (`take_prepared`)."""
        placing = self._placing
        if wait and placing is not None:
            placing[1].join()
        with self._lock:
            error, self._placing_error = self._placing_error, None
        if error is not None:
            raise error

    def prepare(self, order: GrowOrder, run: GrowingRun) -> bool:
        """Place and build a requested block; on a refusal answer the caller and leave the run as it is."""
        assert run.info is not None
        if self.closed is not None:  # taken just before the requests closed: no block is placed for it
            self.answer(order, error=self.closed)
            return False
        try:
            check_input_size(order.ask, run.info, run.specs[-1])
            order.prepared = self.engine.prepare_block(run.next_spec(order.ask.as_step(), request=True))
            order.placed_s = round(time.monotonic() - order.accepted, 3)
        except (GrowpipeError, ValueError) as e:
            self.answer(order, error=describe(e))
            self.say(f"grow   request refused: {order.error}")
            return False
        except Exception as e:  # a worker lost while placing: refuse the request, the run decides on its own
            self.answer(order, error=describe(e))
            raise
        return True

    def attach(self, order: GrowOrder, depth: int, attach: Callable[[Prepared, GrowStep], dict[str, Any]]) -> bool:
        """Attach a prepared request with `attach` unless grow.max_blocks was reached meanwhile; answer it."""
        if why := grow_refusal(self.run_name, depth, 0, self.cfg.max_blocks()):
            self.refuse(order, f"{why}; {MORE_BLOCKS_HINT}")
            return False
        event = attach(order.prepared, order.ask.as_step())
        self.answer(order, answer={**event, **order.prepared.extra, "placed_s": order.placed_s})
        return True

    def refuse(self, order: GrowOrder, why: str) -> None:
        """Answer a prepared request with `why`, its block released: the run stays as it is."""
        self.engine.discard_block(order.prepared)
        self.answer(order, error=why)
        self.say(f"grow   request refused: {why}")

    def answer(self, order: GrowOrder, answer: dict[str, Any] | None = None, error: str | None = None) -> None:
        with self._lock:
            self.pending -= 1
        if answer is not None:
            order.succeed(answer)
        else:
            order.fail(error or "refused")

    def reopen(self, why: str) -> None:
        """Take requests again if they were closed for `why` alone (a run restored to before its joint phase)."""
        with self._lock:
            if self.closed == why:
                self.closed = None

    def close(self, why: str) -> None:
        """Take no request from now on (`why`: what a caller is answered) and answer every one not attached
        yet with it: the run ends or is being stopped. The first reason stays; a second call drains again
        (what the loop's thread held while the first one ran)."""
        with self._lock:
            self.closed = self.closed or why
            why = self.closed
        with contextlib.suppress(Exception):  # the run ends either way; its failure is known already
            self.collect(wait=True)  # no placement starts once closed: wait for the one under way
        with self._lock:
            orders = [self.prepared] if self.prepared is not None else []
            self.prepared = None
            while not self.orders.empty():
                orders.append(self.orders.get_nowait())
        for order in orders:
            if order.prepared is not None:
                self.engine.discard_block(order.prepared)
            self.answer(order, error=why)

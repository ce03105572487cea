"""The reference trainer: every block in order for every batch in this process, no Ray (the oracle).

For a seed, the data order, initial weights and updates are fixed; the Ray engines are checked against
it. `LocalEngine` is its Engine for the run loop (growth, checkpoints and resume as for every engine);
`train_local` runs it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from growpipe.checkpoint import CheckpointStore, block_file
from growpipe.config import RunConfig
from growpipe.data import DataBundle, iterate_batches, load_data
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.evaluation import evaluate_net, measure_early_exit
from growpipe.loop.engine import EpochPart, Pause, Prepared, WithoutBundles
from growpipe.loop.loop import RunLoop
from growpipe.loop.result import RunResult
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout
from growpipe.nn.block import Block
from growpipe.nn.methods import build_block
from growpipe.nn.net import GrowableNet
from growpipe.nn.preserve import exit_state, start_from_exit, starts_preserved
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.prepare import checkpoint_store, resolve_paths, run_callbacks
from growpipe.snapshot import cpu_copy

Progress = Callable[[str], None]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class LocalEngine(WithoutBundles):
    """The whole net in this process: a GrowableNet trained batch by batch, block after block."""

    name = "local"
    stage_table = False
    places_while_training = False  # building a block reseeds this process's generator, which training uses

    def __init__(self, cfg: RunConfig, bundle: DataBundle | None = None):
        self.cfg = cfg
        self.bundle = bundle
        self.info: InputInfo | None = None
        self.net: GrowableNet | None = None
        self.device = torch.device("cpu")
        self._position: tuple[int, int] | None = None  # of the running epoch (Engine.position)

    def open(self, layout: dict[str, Any] | None = None) -> tuple[InputInfo, dict[str, Any]]:
        set_cpu_threads(self.cfg.threads)
        self.device = resolve_device(self.cfg.device)
        self.bundle = self.bundle or load_data(self.cfg.data, self.cfg.seed)
        self.info = InputInfo.from_bundle(self.bundle, self.cfg.net)
        return self.info, self.bundle.describe()

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        assert self.info is not None
        seed_everything(self.cfg.seed)
        rule = self.cfg.rule()
        self.net = GrowableNet(rule, self.info, self.device)
        for spec in specs:
            self.net.append(build_block(rule, spec, self.info))
        return f"{self.cfg.method} on {self.cfg.net.backbone}, {self.net.depth} blocks, device {self.device}"

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        net, bundle = self._net(), self.bundle
        assert bundle is not None
        bs = self.cfg.data.batch_size
        stats = StageStats(stage=0, block="net")
        total = -(-len(bundle.train) // bs)
        self._position = (start_batch, total)
        paused_at = None
        for p in iterate_batches(bundle.train, bs, shuffle=True, seed=self.cfg.seed, epoch=epoch,
                                 side_groups=net.side_groups(), start_batch=start_batch, augment=True):  # fmt: skip
            if (stop_at is not None and p.index >= stop_at) or pause.check():
                paused_at = p.index
                break
            t0 = time.perf_counter()
            stats.add_batch(p.batch_size, net.train_step(p))
            stats.busy_s += time.perf_counter() - t0
            self._position = (p.index + 1, total)
        self._position = None  # no epoch runs: no position for a progress bar to show
        return EpochPart([stats], stats.samples, paused_at)

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        assert self.info is not None
        return Prepared(spec, handle=build_block(self.cfg.rule(), spec, self.info), cacheable=False)

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        net = self._net()
        new = cast(Block, block.handle)  # what prepare_block built
        if starts_preserved(block.spec):  # grow.init: preserve: the exit of the block below, as it is now
            start_from_exit(new, exit_state(net.blocks[-1]))
        if freeze:
            net.freeze()
        net.append(new)

    def thaw(self, lr_factor: float) -> None:
        for b in self._net().blocks:
            b.thaw(lr_factor)

    def evaluate(self) -> dict[str, Any]:
        assert self.bundle is not None
        return evaluate_net(self._net(), self.bundle, self.cfg.eval)

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        assert self.bundle is not None
        return measure_early_exit(self._net(), self.bundle, self.cfg.eval, threshold)

    def checksums(self) -> dict[int, str]:
        return {b.index: b.checksum() for b in self._net().blocks}

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        return [store.write_shard(ckpt_dir, {b.index: b.state_dict()}, block_file(b.index)) for b in self._net().blocks]

    def save_async(self, store: CheckpointStore, ckpt_dir: str) -> Callable[[], list[dict[str, Any]]]:
        """Every block's state copied now; the answer writes the copies (on the checkpoint's own thread)."""
        states = {b.index: cpu_copy(b.state_dict()) for b in self._net().blocks}
        return lambda: [store.write_shard(ckpt_dir, {i: s}, block_file(i)) for i, s in states.items()]

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        net = self._net()
        net.load_state_dict({"blocks": store.load_blocks(ckpt_dir, shards, [b.index for b in net.blocks])})

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        return self.build(specs, None)  # one process: no placement to follow

    def final_states(self) -> list[dict[str, Any]]:
        return self._net().state_dict()["blocks"]

    def position(self) -> tuple[int, int] | None:
        return self._position

    def extras(self) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        """Nothing to release."""

    def _net(self) -> GrowableNet:
        if self.net is None:
            raise RuntimeError("the local engine has no net yet (build was not called)")
        return self.net


def train_local(cfg: RunConfig, progress: Progress | None = print, bundle: DataBundle | None = None,
                resume: str | None = None) -> RunResult:  # fmt: skip
    """Train (and grow) a net in this process (from checkpoint directory `resume` when given, in the MLflow
    run the config names: growpipe.prepare.prepare_run decides it); return the result JSON, the trained net
    and the data. Raises the error that ended the run."""
    cfg = resolve_paths(cfg)
    assert cfg.name is not None, "resolve_paths names every run"
    store = checkpoint_store(cfg)
    say = progress or (lambda _line: None)
    engine = LocalEngine(cfg, bundle)
    loop = RunLoop(cfg, engine, store=store, callbacks=run_callbacks(cfg, cfg.name, say), say=say, resume=resume)
    result = loop.run()
    if loop.failure is not None:
        raise loop.failure
    return RunResult(result, loop.final_net(), engine.bundle)

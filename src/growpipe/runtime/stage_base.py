"""What every stage actor shares, whichever way it trains (local-learning Stage, BP stages): the blocks it
holds, reading the data when it is stage 0, and its part of checkpoints, freezing and evaluation."""

from __future__ import annotations

import copy
import importlib
import math
import resource
from dataclasses import replace
from typing import Any

import ray
import torch

from growpipe import faults
from growpipe.checkpoint import CheckpointStore, block_file
from growpipe.config import RunConfig
from growpipe.data import DataBundle, batch_at, load_data
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.errors import DataNotFoundError, StageError
from growpipe.nn.block import Block
from growpipe.nn.inference import EarlyExit, early_exit_through, exit_probs
from growpipe.nn.methods import build_block
from growpipe.nn.packet import Packet
from growpipe.nn.preserve import ExitState, exit_state, start_from_exit
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.snapshot import cpu_copy

EVAL_BATCH = 512
ALL_EXITS = -1.0
"""eval_packet's threshold for the evaluation pass: every exit computed for every sample."""


def warm_torch() -> None:
    """torch.optim's first optimizer imports torch._dynamo (2-3 s on a small machine): done when a stage actor
    starts, so that a block built on a grow request in a standby actor (grow.standby) does not pay it."""
    importlib.import_module("torch._dynamo")


class StageBase:
    """A stage actor's blocks: its own (`block`) and any packed after it, by block index."""

    CONCURRENCY_GROUPS = {"checkpoint": 1}
    """write_copied_shard writes a checkpoint's shard while the next epoch trains."""

    def __init__(self, index: int, cfg: RunConfig):
        self.index = index
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        warm_torch()
        if self.device.type == "cpu":
            set_cpu_threads(max(1, int(cfg.runtime.cpus_per_stage)))
        self.block: Any = None
        self.packed: list[Block] = []  # blocks packed into this actor after its own (grow.on_no_capacity: pack)
        self.bundle: DataBundle | None = None
        self.word_vectors: torch.Tensor | None = None  # stage 0: net.word_vectors for the embedding block
        self.below: list[Any] = []  # decoders of the blocks under this stage's first (AL exits read through them)
        faults.guard_own_blocks(index)  # GROWPIPE_OWN_BLOCKS_ONLY: no block but its own is built in this actor
        self._eval: dict[Any, dict[int, torch.Tensor]] = {}  # an evaluation pass: per exit, per batch, probs
        self._early: EarlyExit | None = None
        self._eval_sent = 0  # bytes of the activations an evaluation pass handed on
        self._copies: dict[tuple[str, int], dict[str, Any]] = {}  # (checkpoint, block): a state to write (copy_shard)

    # ---- the data (stage 0) -------------------------------------------------------------------------
    def load_data(self) -> tuple[InputInfo, dict[str, Any]]:
        """Stage 0 reads the dataset itself; returns what the loop needs to plan the blocks and its record."""
        try:
            self.bundle = load_data(self.cfg.data, self.cfg.seed)
            info = InputInfo.from_bundle(self.bundle, self.cfg.net)
        except DataNotFoundError as e:  # stage 0 may run on another node than the driver: say where it looked
            node = ray.util.get_node_ip_address()
            raise DataNotFoundError(f"{e} (read by stage 0 on node {node}: a local path must exist there; shared "
                            "storage or a file:// / s3:// / gs:// URI reaches every node)") from None  # fmt: skip
        # the vectors stay here, where the embedding block is built: the driver and other stages never read them
        self.word_vectors = info.word_vectors
        return replace(info, word_vectors=None), self.bundle.describe()

    def train_size(self) -> int:
        """Stage 0: training samples per epoch."""
        return len(self._data().train)

    def _data(self) -> DataBundle:
        if self.bundle is None:
            raise StageError(f"stage {self.index} has no data: stage 0 reads the dataset")
        return self.bundle

    # ---- blocks ---------------------------------------------------------------------------------------
    def _build(self, spec: BlockSpec, info: InputInfo) -> Block:
        """The block `spec` describes (the same seed as the reference trainer), on this stage's device."""
        if self.word_vectors is not None:
            info = replace(info, word_vectors=self.word_vectors)
        with faults.building(spec.index):
            return build_block(self.cfg.rule(), spec, info).to(self.device)

    def _blocks(self) -> list[Block]:
        return [self._require_block(), *self.packed]

    def _block(self, index: int | None) -> Block:
        if index is None:
            return self._require_block()
        for block in self._blocks():
            if block.index == index:
                return block
        raise StageError(f"stage {self.index} does not hold block {index}")

    def _require_block(self) -> Block:
        if self.block is None:
            raise StageError(f"stage {self.index} has no block yet (setup was not called)")
        return self.block

    def freeze(self, index: int | None = None) -> None:
        """Stop learning: the block (default: this stage's own) only forwards from now on."""
        self._block(index).freeze()

    def thaw(self, index: int, lr_factor: float) -> None:
        """Learn again (grow.joint) at `lr_factor` times the learning rate (Block.thaw)."""
        self._block(index).thaw(lr_factor)

    def exit_state(self, index: int | None = None) -> ExitState:
        """CPU copies of a block's exit head (a block grown on top of it starts from them: grow.init preserve)."""
        return exit_state(self._block(index))

    def start_from_exit(self, index: int, below: ExitState) -> None:
        """A newly attached block's exit starts as the block below's (growpipe.nn.preserve.start_from_exit)."""
        start_from_exit(self._block(index), below)

    def checksum(self, index: int | None = None) -> str:
        """SHA-256 of a block's weights (to check that a frozen block stayed bit-identical)."""
        return self._block(index).checksum()

    def state_dict(self, index: int | None = None) -> dict[str, Any]:
        """A CPU copy of a block's modules and optimizer state (the live block stays on its device)."""
        return cpu_copy(self._block(index).state_dict())

    # ---- checkpoints ----------------------------------------------------------------------------------
    def save_shard(self, store: CheckpointStore, ckpt_dir: str, index: int | None = None) -> dict[str, Any]:
        """Write a block's state into checkpoint `ckpt_dir` of the run's `store`; return the manifest's entry."""
        block = self._block(index)
        return store.write_shard(ckpt_dir, {block.index: self.state_dict(block.index)}, block_file(block.index))

    def copy_shard(self, ckpt_dir: str, index: int) -> None:
        """An asynchronous checkpoint's part on the training thread: a CPU copy of block `index`'s state as it is
        now, kept for write_copied_shard (training goes on once this returns)."""
        self._copies[(ckpt_dir, index)] = self.state_dict(index)

    @ray.method(concurrency_group="checkpoint")
    def write_copied_shard(self, store: CheckpointStore, ckpt_dir: str, index: int) -> dict[str, Any]:
        """Write the copy copy_shard took as block `index`'s shard of checkpoint `ckpt_dir`, on a thread of its own
        while training goes on; return the manifest's entry."""
        state = self._copies.pop((ckpt_dir, index))
        return store.write_shard(ckpt_dir, {index: state}, block_file(index))

    @ray.method(concurrency_group="checkpoint")
    def close(self) -> None:
        """End this actor the orderly way, once a shard write queued before it and the call running on the
        training thread have returned (ray.actor.exit_actor; the caller sees the actor die). Killing a threaded
        actor outright while a call of its own completes can abort it in Ray's core (a native dump)."""
        ray.actor.exit_actor()

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]],
                index: int | None = None) -> None:  # fmt: skip
        """Load a block's state from checkpoint `ckpt_dir` of `store` (hash-checked, weights_only)."""
        block = self._block(index)
        block.load_state_dict(store.load_block(ckpt_dir, shards, block.index))
        block.to(self.device)

    # ---- evaluation and inference: the splits stream through the stages, nothing gathers the net -------
    def decoders(self) -> list[Any]:
        """CPU copies of this stage's blocks' decoders, the top one first (AL: the stages above read their exits
        through them; label-side modules, code_dim wide whatever a block's width); [] for other rules."""
        return [copy.deepcopy(d).cpu() for b in reversed(self._blocks()) if (d := b.decoder()) is not None]

    def set_decoders(self, decoders: list[Any]) -> None:
        """The decoders of every block below this stage's first one, the nearest first."""
        self.below = [d.to(self.device).eval() for d in decoders]

    def eval_batches(self, split: str) -> int:
        """Stage 0: how many evaluation batches `split` (test or val) has."""
        return math.ceil(len(self._split(split)) / EVAL_BATCH)

    def eval_source(self, split: str, b: int, side_groups: tuple[str, ...], threshold: float | None = ALL_EXITS,
                    last: int = 0) -> Packet | None:  # fmt: skip
        """Stage 0: read evaluation batch `b` of `split` (in order, not shuffled) and run it through this
        stage's blocks (see eval_packet)."""
        p = batch_at(self._split(split), EVAL_BATCH, b, side_groups)
        self._eval.setdefault("labels", {})[b] = p.labels().cpu()
        return self.eval_packet(p, threshold, last)

    @torch.no_grad()
    def eval_packet(self, p: Packet | None, threshold: float | None = ALL_EXITS, last: int = 0) -> Packet | None:
        """Run an evaluation packet through this stage's blocks; what goes on to the next stage (None: nothing).

        threshold ALL_EXITS (the evaluation): every exit's probabilities are kept for every sample, every row
        goes on. Otherwise real early exit: at each exit the samples that `threshold` confident (None: none;
        all at the net's last exit, depth `last`) leave and are kept here, only the others go on."""
        if p is None:
            return None
        faults.maybe_die_in_eval(self.index)
        p, rows = p.to(self.device), p.rows
        if threshold != ALL_EXITS:
            if self._early is None:
                self._early = EarlyExit(threshold, self.cfg.eval.confidence, last)
            assert rows is not None, "batch_at numbers the rows of every evaluation packet"
            rest = early_exit_through(self._blocks(), p, rows, self._early, self.below)
            if rest is None:
                return None
            p = rest
        else:
            below = list(self.below)
            for block in self._blocks():
                p = block.forward(p)
                probs = exit_probs(block, p, below)
                if block.decoder() is not None:
                    below = [block.decode, *below]
                if probs is not None:
                    self._eval.setdefault(block.index + 1, {})[p.index] = probs.cpu()
            p.rows = rows
        p = p.to("cpu")
        self._eval_sent += p.nbytes
        return p

    def eval_results(self) -> dict[Any, Any]:
        """What the last pass kept here, then forgotten: per exit depth the probabilities of every sample in
        order (and stage 0: the labels, under "labels"), or the samples that left here ("exited")."""
        out: dict[Any, Any] = {k: torch.cat([v[b] for b in sorted(v)]) for k, v in self._eval.items()}
        if self._early is not None:
            out["exited"] = self._early.result()
        out["sent_bytes"] = self._eval_sent
        self._eval, self._early, self._eval_sent = {}, None, 0
        return out

    def cost_parts(self) -> list[tuple[int, int, int, int, bool, bool]]:
        """Each of this stage's blocks' MACs per sample (see Block.cost_parts)."""
        return [b.cost_parts() for b in self._blocks()]

    def _split(self, split: str) -> Any:
        data = self._data()
        part = data.test if split == "test" else data.val
        if part is None:
            raise StageError(f"stage {self.index}: the data has no {split} split")
        return part


def peak_rss_mb() -> float:
    """The largest resident memory this process has had, in MiB (Linux: VmHWM, its own since its exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

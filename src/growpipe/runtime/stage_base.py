"""What every stage actor shares, whichever way it trains (local-learning Stage, BP stages): the blocks it
holds, reading the data when it is stage 0, and its part of checkpoints, freezing and evaluation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from growpipe.checkpoint import CheckpointStore, block_file
from growpipe.config import RunConfig
from growpipe.data import DataBundle, load_data
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.errors import DataNotFoundError, StageError
from growpipe.nn.block import Block
from growpipe.nn.methods import build_block
from growpipe.nn.specs import BlockSpec, InputInfo


class StageBase:
    """A stage actor's blocks: its own (`block`) and any packed after it, by block index."""

    def __init__(self, index: int, cfg: RunConfig):
        self.index = index
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        if self.device.type == "cpu":
            set_cpu_threads(max(1, int(cfg.runtime.cpus_per_stage)))
        self.block: Any = None
        self.packed: list[Block] = []  # blocks packed into this actor after its own (grow.on_no_capacity: pack)
        self.bundle: DataBundle | None = None
        self.word_vectors: torch.Tensor | None = None  # stage 0: net.word_vectors for the embedding block

    # ---- the data (stage 0) -------------------------------------------------------------------------
    def load_data(self) -> tuple[InputInfo, dict[str, Any]]:
        """Stage 0 reads the dataset itself; returns what the loop needs to plan the blocks and its record."""
        try:
            self.bundle = load_data(self.cfg.data, self.cfg.seed)
            info = InputInfo.from_bundle(self.bundle, self.cfg.net)
        except DataNotFoundError as e:  # stage 0 may run on another node than the driver: say where it looked
            import ray

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

    def checksum(self, index: int | None = None) -> str:
        """SHA-256 of a block's weights (to check that a frozen block stayed bit-identical)."""
        return self._block(index).checksum()

    def state_dict(self, index: int | None = None) -> dict[str, Any]:
        """A CPU copy of a block's modules and optimizer state (the live block stays on its device)."""
        return cpu_copy(self._block(index).state_dict())

    # ---- checkpoints ----------------------------------------------------------------------------------
    def save_shard(self, ckpt_dir: str, index: int | None = None) -> dict[str, Any]:
        """Write a block's state into checkpoint `ckpt_dir`; return the manifest's entry for it."""
        block = self._block(index)
        return self._store().write_shard(ckpt_dir, {block.index: self.state_dict(block.index)}, block_file(block.index))

    def restore(self, ckpt_dir: str, shards: list[dict[str, Any]], index: int | None = None) -> None:
        """Load a block's state from checkpoint `ckpt_dir` (hash-checked, weights_only)."""
        block = self._block(index)
        block.load_state_dict(self._store().load_block(ckpt_dir, shards, block.index))
        block.to(self.device)

    def _store(self) -> CheckpointStore:
        return CheckpointStore(self.cfg.checkpoint.uri, self.cfg.name, self.cfg.checkpoint.keep)

    # ---- evaluation (stage 0 holds the data) ----------------------------------------------------------
    def evaluate(self, topology: list[dict[str, Any]], info: InputInfo, *states: dict[str, Any]) -> dict[str, Any]:
        """Rebuild the whole net from every stage's state and evaluate every exit on the test split."""
        from growpipe.evaluation import evaluate_states

        return evaluate_states(self.cfg, self._data(), info, topology, list(states), self.device)


def cpu_copy(obj: Any) -> Any:
    """The same nested structure with every tensor detached and copied to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj

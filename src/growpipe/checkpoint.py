"""Checkpoints: a directory with `state.pt` (every block's modules and optimizers) and `manifest.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from growpipe.config import RunConfig, build_config
from growpipe.errors import CheckpointError
from growpipe.fsutil import atomic_write_dir
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo

FORMAT_VERSION = 1


def save_checkpoint(path: str | Path, net: GrowableNet, extra: dict[str, Any] | None = None) -> Path:
    """Write the net's weights, optimizer state, config and topology to directory `path`, atomically."""
    manifest = {
        "format_version": FORMAT_VERSION,
        "config": net.cfg.model_dump(mode="json"),
        "input": net.info.to_dict(),
        "topology": net.topology(),
        **(extra or {}),
    }
    state = net.state_dict()

    def fill(tmp: Path) -> None:
        torch.save(state, tmp / "state.pt")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    return atomic_write_dir(path, fill)


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a checkpoint directory."""
    p = Path(path)
    if not (p / "manifest.json").is_file() or not (p / "state.pt").is_file():
        raise CheckpointError(f"checkpoint: {p} is not a checkpoint (needs manifest.json and state.pt)")
    try:
        manifest = json.loads((p / "manifest.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"checkpoint: {p}/manifest.json is not valid JSON ({e.msg}); the checkpoint is damaged"
        ) from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint: {p} has format {manifest.get('format_version')}, this growpipe reads {FORMAT_VERSION}"
        )
    return manifest


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[GrowableNet, dict[str, Any]]:
    """Rebuild the net of a checkpoint and load its weights (weights_only=True: no code is unpickled)."""
    manifest = read_manifest(path)
    cfg: RunConfig = build_config(manifest["config"], f"{path}/manifest.json")
    info = InputInfo.from_dict(manifest["input"])
    net = GrowableNet.from_topology(cfg, info, manifest["topology"], device)
    state = torch.load(Path(path) / "state.pt", map_location=device, weights_only=True)
    net.load_state_dict(state)
    return net, manifest

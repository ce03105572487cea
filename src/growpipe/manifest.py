"""What makes a checkpoint's `manifest.json` growpipe's: the format checks checkpoint.py reads every manifest
with, and the test outputs.py uses to recognise a saved net it may replace (below both, so neither imports
the other for it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from growpipe.errors import CheckpointError

FORMAT_VERSION = 3
"""The format growpipe writes. 3: every block spec carries its rule and the rule's architecture choices."""
OLDEST_FORMAT = 2
"""The oldest format growpipe reads (growpipe.saved_config.current_manifest upgrades it to the current one)."""
SAVED_NET_FILES = {"manifest.json", "state.pt"}
"""What save_net writes into its directory, and nothing else."""


def parse_manifest(data: bytes, path: str) -> dict[str, Any]:
    """The manifest in `data` (read from checkpoint directory `path`), as written; CheckpointError when it is not
    JSON, not an object, of a format version growpipe does not read or lists its shards wrongly."""
    try:
        manifest = json.loads(data.decode())
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: manifest.json is not valid JSON ({e}); it is damaged") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint {path}: manifest.json holds a JSON {type(manifest).__name__}, not a "
                              "growpipe manifest (an object); it is damaged or not growpipe's")  # fmt: skip
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not OLDEST_FORMAT <= version <= FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format {version}, this growpipe reads {OLDEST_FORMAT} to {FORMAT_VERSION} "
            "(written by another growpipe version: evaluate it with that version or train again)"
        )
    if not _shards_ok(manifest.get("shards", [])):
        raise CheckpointError(f"checkpoint {path}: manifest.json lists its shards wrongly (each needs a file name, "
                              "a SHA-256 and its blocks); it is damaged or not growpipe's")  # fmt: skip
    return manifest


def _shards_ok(shards: Any) -> bool:
    """Whether a manifest's `shards` is a list of {file: a plain name, sha256: str, blocks: [int, ...]}."""
    return isinstance(shards, list) and all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and e["file"] and "/" not in e["file"]
        and e["file"] not in (".", "..") and isinstance(e.get("sha256"), str) and isinstance(e.get("blocks"), list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in e["blocks"])
        for e in shards
    )  # fmt: skip


def is_saved_net(path: Path) -> bool:
    """Whether local directory `path` holds a saved net and nothing else (so replacing it loses nothing)."""
    if not {p.name for p in path.iterdir()} <= SAVED_NET_FILES:
        return False
    try:
        parse_manifest((path / "manifest.json").read_bytes(), str(path))
    except (OSError, CheckpointError):
        return False
    return True

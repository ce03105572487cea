"""Run checkpoints in a storage URI (a local path, or any pyarrow.fs URI: s3://, gs://, hdfs://, ...).

Layout: URI/RUN_NAME/ckpt-EEEEEE-BBBBBBB-SSSS/ (completed epochs, next batch, sequence number), holding one
`stage-K.pt` per stage (written by that stage's actor, so no weights pass through the controller) and
`manifest.json`, written last under a temporary name and then moved into place: a checkpoint is complete
exactly when its manifest exists. A process killed while writing leaves an incomplete directory that
readers skip and a later prune removes. The manifest records each shard's SHA-256; loading checks it (a
changed file is refused) and uses `torch.load(weights_only=True)`."""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from growpipe.errors import CheckpointError

FORMAT_VERSION = 1
NAME = re.compile(r"^ckpt-(\d{6})-(\d{7})-(\d{4})$")
RESUMABLE_DIFFERENCES = ("name", "tracking.", "runtime.", "checkpoint.", "train.epochs", "eval.", "grow.max_blocks")
"""Config fields a resumed run may change; any other difference is refused."""


def _filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, root path) for a URI or a local path (made absolute)."""
    from pyarrow import fs

    if "://" not in uri:
        local = Path(uri).expanduser().resolve()
        return fs.LocalFileSystem(), str(local)
    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for unknown schemes and bad URIs
        raise CheckpointError(f"checkpoint.uri {uri!r}: {e}; use a local path or a pyarrow.fs URI (s3://...)") from None


@dataclass(frozen=True)
class CheckpointRef:
    """One complete checkpoint: where it is and the position it holds."""

    path: str
    epoch: int
    batch: int
    seq: int


class CheckpointStore:
    """The checkpoints of one run; safe to use from several processes (each stage writes its own shard)."""

    def __init__(self, uri: str, run_name: str, keep: int = 2):
        self.uri = uri
        self.run_name = run_name
        self.keep = keep
        self.fs, root = _filesystem(uri)
        self.root = f"{root.rstrip('/')}/{run_name}"

    # ---- writing -----------------------------------------------------------------------------------------
    def dir_for(self, epoch: int, batch: int, seq: int) -> str:
        """The directory of checkpoint number `seq` of the run, at (completed epochs, next batch of the
        following epoch); the number keeps two checkpoints at one position (e.g. before and after a growth)
        apart."""
        return f"{self.root}/ckpt-{epoch:06d}-{batch:07d}-{seq:04d}"

    def write_shard(self, ckpt_dir: str, stage: int, state: dict[str, Any]) -> str:
        """Write one stage's state; return its SHA-256 (for the manifest)."""
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        self.fs.create_dir(ckpt_dir, recursive=True)
        with self.fs.open_output_stream(f"{ckpt_dir}/stage-{stage}.pt") as f:
            f.write(data)
        return hashlib.sha256(data).hexdigest()

    def commit(self, ckpt_dir: str, manifest: dict[str, Any]) -> CheckpointRef:
        """Write the manifest last (temporary name, then moved into place), then prune old checkpoints."""
        body = json.dumps({"format_version": FORMAT_VERSION, "written_at": time.time(), **manifest}, indent=1)
        tmp = f"{ckpt_dir}/.manifest.json.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(body.encode())
        self.fs.move(tmp, f"{ckpt_dir}/manifest.json")
        self.prune()
        return CheckpointRef(ckpt_dir, manifest["epoch"], manifest["batch"], manifest["seq"])

    def prune(self) -> None:
        """Keep the newest `keep` complete checkpoints; remove every directory older than the oldest kept
        (complete or left incomplete by a crash)."""
        complete = self.complete()
        if not complete:
            return
        oldest_kept = min((c.epoch, c.batch, c.seq) for c in complete[-self.keep :])
        for path, pos in self._dirs():
            if pos < oldest_kept:
                self.fs.delete_dir(path)

    def clear(self) -> int:
        """Remove every checkpoint directory of this run (a fresh run reusing the name); how many went."""
        dirs = self._dirs()
        for path, _ in dirs:
            self.fs.delete_dir(path)
        return len(dirs)

    # ---- reading -----------------------------------------------------------------------------------------
    def _dirs(self) -> list[tuple[str, tuple[int, int, int]]]:
        from pyarrow import fs

        try:
            infos = self.fs.get_file_info(fs.FileSelector(self.root, allow_not_found=True))
        except OSError:
            return []
        out = []
        for info in infos:
            m = NAME.match(info.base_name)
            if m and info.type == fs.FileType.Directory:
                out.append((info.path, (int(m.group(1)), int(m.group(2)), int(m.group(3)))))
        return sorted(out, key=lambda d: d[1])

    def complete(self) -> list[CheckpointRef]:
        """Complete checkpoints (their manifest exists), oldest first."""
        from pyarrow import fs

        out = []
        for path, (epoch, batch, seq) in self._dirs():
            if self.fs.get_file_info(f"{path}/manifest.json").type == fs.FileType.File:
                out.append(CheckpointRef(path, epoch, batch, seq))
        return out

    def latest(self) -> CheckpointRef | None:
        """The newest complete checkpoint, or None."""
        done = self.complete()
        return done[-1] if done else None

    def read_manifest(self, ref: CheckpointRef) -> dict[str, Any]:
        try:
            with self.fs.open_input_stream(f"{ref.path}/manifest.json") as f:
                manifest = json.loads(f.read().decode())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {ref.path}: manifest.json is unreadable ({e}); it is damaged") from None
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {ref.path}: format {manifest.get('format_version')}, this growpipe reads {FORMAT_VERSION}"
            )
        return manifest

    def load_shard(self, ckpt_dir: str, stage: int, sha256: str) -> dict[str, Any]:
        """One stage's state, refused unless its bytes hash to what the manifest recorded."""
        path = f"{ckpt_dir}/stage-{stage}.pt"
        try:
            with self.fs.open_input_stream(path) as f:
                data = f.read()
        except OSError:
            raise CheckpointError(f"checkpoint {ckpt_dir}: stage-{stage}.pt is missing") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise CheckpointError(
                f"checkpoint {ckpt_dir}: stage-{stage}.pt does not match the SHA-256 in its manifest "
                "(changed or damaged after it was written); refusing to load it"
            )
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted config fields whose values differ, other than those a resumed run may change."""
    out = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, dotted + ".")
        elif a != b and not dotted.startswith(RESUMABLE_DIFFERENCES):
            out.append(f"{dotted}: checkpoint has {a!r}, this run has {b!r}")
    return out


def check_input_matches(saved: dict[str, Any], found: dict[str, Any]) -> None:
    """Refuse data whose shape, classes or vocabulary (InputInfo.to_dict) differ from what a checkpoint's
    net was trained on (`saved`, its manifest's input)."""
    for key, want in saved.items():
        if found.get(key) != want:
            raise CheckpointError(
                f"data: the loaded data's {key} is {found.get(key)} but the checkpoint was trained on {want}; "
                "point data.root at the data it was trained on"
            )

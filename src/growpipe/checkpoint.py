"""Checkpoints, one format for every engine: a directory with shard files and `manifest.json`.

A run's restore points live in a storage URI (a local path, or any pyarrow.fs URI: s3://, gs://, ...) as
URI/RUN_NAME/ckpt-EEEEEE-BBBBBBB-SSSS/ (completed epochs, next batch, sequence number). Each worker writes
the shards of the blocks it holds (`block-K.pt`: no weights pass through the loop), then the loop writes
`manifest.json` last under a temporary name and moves it into place: a checkpoint is complete exactly when
its manifest exists. `growpipe train --save DIR` writes the same format with one shard (`state.pt`, every
block). The manifest records each shard's SHA-256; loading checks it and uses torch.load(weights_only=True).
"""

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

from growpipe.config import RunConfig, build_config
from growpipe.errors import CheckpointError
from growpipe.outputs import write_checkpoint_dir

FORMAT_VERSION = 2
NAME = re.compile(r"^ckpt-(\d{6})-(\d{7})-(\d{4})$")
RESUMABLE_DIFFERENCES = ("name", "tracking.", "runtime.", "checkpoint.", "train.epochs", "eval.", "grow.max_blocks")
"""Config fields a resumed run may change; any other difference is refused."""


def _filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, root path) for a URI or a local path (made absolute)."""
    from pyarrow import fs

    if "://" not in uri:
        return fs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for unknown schemes and bad URIs
        raise CheckpointError(f"checkpoint.uri {uri!r}: {e}; use a local path or a pyarrow.fs URI (s3://...)") from None


def check_uri(uri: str) -> None:
    """CheckpointError when pyarrow has no filesystem for `uri` (checked before a run starts)."""
    _filesystem(uri)


def block_file(index: int) -> str:
    """The shard file of block `index` in a run checkpoint."""
    return f"block-{index}.pt"


def encode_shard(states: dict[int, dict[str, Any]], file: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of a shard holding `states` (block index -> state) and its manifest entry."""
    buf = io.BytesIO()
    torch.save({"blocks": {str(i): s for i, s in states.items()}}, buf)
    data = buf.getvalue()
    return data, {"file": file, "sha256": hashlib.sha256(data).hexdigest(), "blocks": sorted(states)}


def decode_shard(data: bytes, entry: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The block states in a shard's bytes (by str(index)), refused unless they hash to the manifest's
    SHA-256."""
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(
            f"checkpoint {where}: {entry['file']} does not match the SHA-256 in its manifest "
            "(changed or damaged after it was written); refusing to load it"
        )
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)["blocks"]


def shard_of(shards: list[dict[str, Any]], index: int, where: str) -> dict[str, Any]:
    """The manifest entry of the shard that holds block `index`."""
    for entry in shards:
        if index in entry["blocks"]:
            return entry
    raise CheckpointError(f"checkpoint {where}: no shard holds block {index}; the manifest is damaged")


@dataclass(frozen=True)
class CheckpointRef:
    """One complete checkpoint: where it is and the position it holds."""

    path: str
    epoch: int
    batch: int
    seq: int


class CheckpointStore:
    """The checkpoints of one run (or any checkpoint directory, through `read_manifest` / `load_block`);
    safe to use from several processes: each worker writes its own shards."""

    def __init__(self, uri: str, run_name: str, keep: int = 2):
        self.uri = uri
        self.run_name = run_name
        self.keep = keep
        self.fs, root = _filesystem(uri)
        self.root = f"{root.rstrip('/')}/{run_name}"
        self.protected: set[str] = set()
        """Checkpoint directories `prune` leaves however old (the best epoch's, for model selection)."""

    # ---- writing -----------------------------------------------------------------------------------------
    def dir_for(self, epoch: int, batch: int, seq: int) -> str:
        """The directory of checkpoint number `seq` at (completed epochs, next batch of the following epoch);
        the number keeps two checkpoints at one position (before and after a growth) apart."""
        return f"{self.root}/ckpt-{epoch:06d}-{batch:07d}-{seq:04d}"

    def write_shard(self, ckpt_dir: str, states: dict[int, dict[str, Any]], file: str | None = None) -> dict[str, Any]:
        """Write the states of some blocks (block index -> state) as one shard; return its manifest entry."""
        data, entry = encode_shard(states, file or block_file(min(states)))
        self.fs.create_dir(ckpt_dir, recursive=True)
        with self.fs.open_output_stream(f"{ckpt_dir}/{entry['file']}") as f:
            f.write(data)
        return entry

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
        """Keep the newest `keep` complete checkpoints and the `protected` ones; remove every other directory
        older than the oldest kept (complete or left incomplete by a crash)."""
        complete = [c for c in self.complete() if c.path not in self.protected]
        if not complete:
            return
        oldest_kept = min((c.epoch, c.batch, c.seq) for c in complete[-self.keep :])
        for path, pos in self._dirs():
            if pos < oldest_kept and path not in self.protected:
                self.fs.delete_dir(path)

    def clear(self) -> int:
        """Remove every checkpoint directory of this run (a fresh run reusing the name, --overwrite); how many
        went."""
        dirs = self._dirs()
        for path, _ in dirs:
            self.fs.delete_dir(path)
        return len(dirs)

    # ---- reading -----------------------------------------------------------------------------------------
    def foreign(self) -> list[str]:
        """What the run's folder holds that growpipe did not put there (anything but ckpt-* folders); a file
        where the folder should be is listed as itself."""
        from pyarrow import fs

        info = self.fs.get_file_info(self.root)
        if info.type == fs.FileType.NotFound:
            return []
        if info.type != fs.FileType.Directory:
            return [self.root]
        entries = self.fs.get_file_info(fs.FileSelector(self.root))
        return sorted(e.base_name for e in entries if not (NAME.match(e.base_name) and e.type == fs.FileType.Directory))

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

    def read_manifest(self, ref: CheckpointRef | str) -> dict[str, Any]:
        """The manifest of a checkpoint directory (refused when damaged or of another format)."""
        path = ref.path if isinstance(ref, CheckpointRef) else ref
        return _read_manifest(self.fs, path)

    def verify(self, ckpt_dir: str) -> dict[str, Any]:
        """The manifest of checkpoint `ckpt_dir` once every shard it lists is there and hashes to its SHA-256
        (read in chunks: nothing is unpickled, no block is materialised); CheckpointError otherwise."""
        manifest = self.read_manifest(ckpt_dir)
        for entry in manifest.get("shards", []):
            digest = hashlib.sha256()
            try:
                with self.fs.open_input_stream(f"{ckpt_dir}/{entry['file']}") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
            except OSError:
                raise CheckpointError(f"checkpoint {ckpt_dir}: {entry['file']} is missing") from None
            if digest.hexdigest() != entry["sha256"]:
                raise CheckpointError(f"checkpoint {ckpt_dir}: {entry['file']} does not match the SHA-256 in its "
                                      "manifest (changed or damaged after it was written)")  # fmt: skip
        return manifest

    def load_block(self, ckpt_dir: str, shards: list[dict[str, Any]], index: int) -> dict[str, Any]:
        """Block `index`'s state, refused unless its shard hashes to what the manifest recorded."""
        return self.load_blocks(ckpt_dir, shards, [index])[0]

    def load_blocks(self, ckpt_dir: str, shards: list[dict[str, Any]], indices: list[int]) -> list[dict[str, Any]]:
        """The states of blocks `indices` (each shard read and hash-checked once)."""
        return load_states(self.fs, ckpt_dir, shards, indices)


def load_states(filesystem: Any, ckpt_dir: str, shards: list[dict[str, Any]], indices: list[int]) -> list[dict]:
    """The states of blocks `indices` from checkpoint directory `ckpt_dir` on a pyarrow `filesystem`, each
    shard read and checked against its manifest entry's SHA-256 once."""
    read: dict[str, dict[str, dict[str, Any]]] = {}
    out = []
    for index in indices:
        entry = shard_of(shards, index, ckpt_dir)
        if entry["file"] not in read:
            try:
                with filesystem.open_input_stream(f"{ckpt_dir}/{entry['file']}") as f:
                    data = f.read()
            except OSError:
                raise CheckpointError(f"checkpoint {ckpt_dir}: {entry['file']} is missing") from None
            read[entry["file"]] = decode_shard(data, entry, ckpt_dir)
        out.append(read[entry["file"]][str(index)])
    return out


def copy_shards(src_fs: Any, src_dir: str, shards: list[dict[str, Any]], dst_fs: Any, dst_dir: str) -> None:
    """Copy the shard files of `shards` from one checkpoint directory to another, byte for byte (their
    manifest entries stay valid)."""
    dst_fs.create_dir(dst_dir, recursive=True)
    for entry in shards:
        with src_fs.open_input_stream(f"{src_dir}/{entry['file']}") as src, \
                dst_fs.open_output_stream(f"{dst_dir}/{entry['file']}") as dst:  # fmt: skip
            dst.write(src.read())


def run_folder_problem(store: CheckpointStore, fresh: bool, overwrite: bool) -> str | None:
    """Why a run may not write its checkpoints into `store` (None: it may): its folder holds what growpipe
    did not write, or (a `fresh` start, not `overwrite`) an earlier run of the same name left restore points."""
    if foreign := store.foreign():
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return (f"checkpoint.uri: {store.root} holds what growpipe did not write ({shown}); refusing to write "
                "checkpoints there: choose another checkpoint.uri or name")  # fmt: skip
    done = store.complete() if fresh and not overwrite else []
    if not done:
        return None
    name, newest = store.run_name, done[-1]
    return (f"name: run {name!r} already has {len(done)} checkpoint(s) in {store.root} (newest: epoch {newest.epoch}"
            f", batch {newest.batch}); continue it with --resume {name}, start another with --set name=OTHER, or "
            "replace them with --overwrite")  # fmt: skip


def _read_manifest(filesystem: Any, path: str) -> dict[str, Any]:
    try:
        with filesystem.open_input_stream(f"{path}/manifest.json") as f:
            manifest = json.loads(f.read().decode())
    except OSError:
        raise CheckpointError(f"checkpoint: {path} is not a checkpoint (no manifest.json)") from None
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: manifest.json is not valid JSON ({e}); it is damaged") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint {path}: manifest.json holds a JSON {type(manifest).__name__}, not a "
                              "growpipe manifest (an object); it is damaged or not growpipe's")  # fmt: skip
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format {manifest.get('format_version')}, this growpipe reads {FORMAT_VERSION} "
            "(written by another growpipe version: evaluate it with that version or train again)"
        )
    if isinstance(manifest.get("config"), dict):
        manifest["config"] = with_fields_added_since(manifest["config"])
    return manifest


FIELDS_ADDED_SINCE: dict[str, tuple[Any, tuple[str, Any] | None]] = {
    "net.input_norm": (False, ("net.backbone", "transformer")),
    "eval.restore_best": (False, None),
    "scpl.classifier_norm": (False, ("method", ("scpl", "dascpl"))),
}
"""Config fields added after checkpoints were first written whose default changes what a run does: the value
that keeps a checkpoint written before them as it was (e.g. blocks grown after a resume have no input
LayerNorm, like the blocks restored), and the (field, value or tuple of values) of the configs where it
matters (None: all). Other fields a checkpoint predates take their defaults."""


def _field(config: dict[str, Any], dotted: str, missing: Any = None) -> Any:
    """The value of dotted field `dotted` (e.g. "net.backbone", "method") in a config dict, else `missing`."""
    where: Any = config
    for part in dotted.split("."):
        if not isinstance(where, dict) or part not in where:
            return missing
        where = where[part]
    return where


def with_fields_added_since(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config with FIELDS_ADDED_SINCE filled in where it predates them and they matter."""
    out = dict(config)
    for dotted, (value, only) in FIELDS_ADDED_SINCE.items():
        section, key = dotted.split(".")
        if only is not None:
            want = only[1] if isinstance(only[1], tuple) else (only[1],)
            if _field(config, only[0]) not in want:
                continue
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section] = {**out[section], key: value}
    return out


def keeping_added_fields(cfg: RunConfig, saved: dict[str, Any]) -> RunConfig:
    """`cfg` with checkpoint config `saved`'s values (as filled by with_fields_added_since) of the fields in
    FIELDS_ADDED_SINCE, for a run that continues that checkpoint from a config of its own (a Tune trial): its
    blocks are then built as they were saved."""
    data = cfg.model_dump(mode="json")
    changed = False
    for dotted in FIELDS_ADDED_SINCE:
        section, key = dotted.split(".")
        kept = _field(saved, dotted, missing=data[section][key])
        if kept != data[section][key]:
            data[section] = {**data[section], key: kept}
            changed = True
    return build_config(data, "the config with the checkpoint's values of fields added since") if changed else cfg


def open_checkpoint(path: str | Path) -> tuple[CheckpointStore, str, dict[str, Any]]:
    """A checkpoint directory given by the user: a `--save` directory, a run checkpoint (ckpt-...), or a
    run's checkpoint folder (its newest complete checkpoint); local or a pyarrow.fs URI.

    Returns (a store on its filesystem, the directory, its manifest)."""
    text = str(path)
    parent, _, name = text.rstrip("/").rpartition("/")
    store = CheckpointStore(parent or ".", name)  # the run folder, when `path` is one
    from pyarrow import fs

    target = store.root
    if store.fs.get_file_info(f"{target}/manifest.json").type != fs.FileType.File:
        latest = store.latest()
        if latest is None:
            raise CheckpointError(
                f"checkpoint: {path} is not a checkpoint (no manifest.json, and no complete ckpt-* inside)"
            )
        target = latest.path
    return store, target, store.read_manifest(target)


def check_input_matches(saved: dict[str, Any], found: dict[str, Any]) -> None:
    """Refuse data whose shape, classes or vocabulary (InputInfo.to_dict) differ from what a checkpoint's
    net was trained on (`saved`, its manifest's input)."""
    for key, want in saved.items():
        if found.get(key) != want:
            raise CheckpointError(
                f"data: the loaded data's {key} is {found.get(key)} but the checkpoint was trained on {want}; "
                "point data.root at the data it was trained on"
            )


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted config fields whose values differ, other than those a resumed run may change. A field the saved
    config predates (absent from it) counts as its value in `current` only through with_fields_added_since or
    its default: compare against build_config(saved).model_dump(mode="json")."""
    out = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, dotted + ".")
        elif a != b and not dotted.startswith(RESUMABLE_DIFFERENCES):
            out.append(f"{dotted}: checkpoint has {a!r}, this run has {b!r}")
    return out


# ---- whole nets (growpipe train --save, MLflow artifacts, Tune checkpoints) ------------------------------
SAVED_NET_FILES = {"manifest.json", "state.pt"}
"""What save_net writes into its directory, and nothing else."""


def is_saved_net(path: Path) -> bool:
    """Whether local directory `path` holds a saved net and nothing else (so replacing it loses nothing)."""
    from pyarrow import fs

    if not {p.name for p in path.iterdir()} <= SAVED_NET_FILES:
        return False
    try:
        _read_manifest(fs.LocalFileSystem(), str(path))
    except CheckpointError:
        return False
    return True


def save_net(path: str | Path, net: Any, cfg: RunConfig, summary: dict[str, Any] | None = None,
             mlflow_run_id: str | None = None) -> Path:  # fmt: skip
    """Write a trained net as a one-shard checkpoint directory `path`, atomically: `state.pt` (every block's
    modules and optimizers) and the manifest, with the epochs, history and growth of its run's `summary`."""
    data, entry = encode_shard(dict(enumerate(net.state_dict()["blocks"])), "state.pt")
    summary = summary or {}
    manifest = {
        "format_version": FORMAT_VERSION,
        "written_at": time.time(),
        "run": cfg.name,
        "epoch": summary.get("epochs", 0),
        "batch": 0,
        "seq": 0,
        "history": summary.get("history", []),
        "growth": summary.get("growth", []),
        "mlflow_run_id": mlflow_run_id,
        "config": cfg.model_dump(mode="json"),
        "input": net.info.to_dict(),
        "topology": net.topology(),
        "shards": [entry],
    }

    def fill(tmp: Path) -> None:
        (tmp / "state.pt").write_bytes(data)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    return write_checkpoint_dir(path, fill)


def load_net(path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, dict[str, Any], RunConfig]:
    """Rebuild the net of any checkpoint directory (see open_checkpoint) with its weights, hash-checked.
    Returns (net, manifest, its run config)."""
    from growpipe.nn.net import GrowableNet
    from growpipe.nn.specs import InputInfo

    store, target, manifest = open_checkpoint(path)
    cfg = build_config(manifest["config"], f"{target}/manifest.json")
    info = InputInfo.from_dict(manifest["input"])
    states = store.load_blocks(target, manifest["shards"], [d["index"] for d in manifest["topology"]])
    return GrowableNet.from_states(cfg.rule(), info, manifest["topology"], states, device), manifest, cfg

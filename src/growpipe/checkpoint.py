"""Checkpoints, one format for every engine: a directory with shard files and `manifest.json`.

A run's restore points live in a storage URI (a local path, or any pyarrow.fs URI: s3://, gs://, ...) as
URI/RUN_NAME/ckpt-EEEEEE-BBBBBBB-SSSS/ (completed epochs, next batch, sequence number). Each worker writes
the shards of the blocks it holds (`block-K.pt`: no weights pass through the loop), then the loop writes
`manifest.json` last under a temporary name and moves it into place: a checkpoint is complete exactly when
its manifest exists; written in the background (growpipe.snapshot), one write at a time per store, and a read
through that store waits for it. `growpipe train --save DIR` writes the same format with one shard (`state.pt`,
every block). The manifest records each shard's SHA-256; loading checks it and uses torch.load(weights_only=True).
Its topology holds every block's full spec (rule and architecture included): a net is rebuilt from it and
the input description alone. Every manifest is read through one versioned reader (saved_config's
current_manifest): an older format comes out in today's form.

Removing a checkpoint (pruning, a fresh run of the name, --overwrite) deletes only growpipe's files in its
folder (the manifest, the shards it names, claims); a folder holding anything else is refused before a run
starts. A server following the run claims the checkpoint it loads (`.claim-ID.json`, refreshed while held):
pruning skips a checkpoint with a fresh claim (see claim_holds, prune_plan).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pyarrow import fs

from growpipe.config import RunConfig
from growpipe.errors import CheckpointError
from growpipe.manifest import FORMAT_VERSION, parse_manifest
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from growpipe.outputs import write_checkpoint_dir
from growpipe.saved_config import current_manifest, inference_rule
from growpipe.snapshot import BackgroundWrite

NAME = re.compile(r"^ckpt-(\d{6})-(\d{7})-(\d{4})$")
SHARD_NAME = re.compile(r"^(block-\d+|state)\.pt$")
MANIFEST, WRITING, RETIRING = "manifest.json", ".manifest.json.tmp", ".manifest.json.retiring"
DAMAGED = "manifest.json.damaged"
"""A checkpoint's manifest, its temporary names while it is written and while the checkpoint is removed, and
the name a resume sets a damaged one aside under (the checkpoint is then no longer complete)."""
CLAIM_PREFIX = ".claim-"
CLAIM = re.compile(r"^\.claim-[0-9a-f]{8,64}\.json$")
CLAIM_TTL_S = 120.0
"""A claim not refreshed for this long no longer holds its checkpoint (its holder hung, or died on another
machine); a holder refreshes it every CLAIM_TTL_S / 4."""
Position = tuple[int, int, int]


def filesystem_of(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, root path) for a URI or a local path (made absolute)."""
    if "://" not in uri:
        return fs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for unknown schemes and bad URIs
        raise CheckpointError(f"checkpoint.uri {uri!r}: {e}; use a local path or a pyarrow.fs URI (s3://...)") from None


def check_uri(uri: str) -> None:
    """CheckpointError when pyarrow has no filesystem for `uri` (checked before a run starts)."""
    filesystem_of(uri)


def block_file(index: int) -> str:
    """The shard file of block `index` in a run checkpoint."""
    return f"block-{index}.pt"


def encode_shard(states: dict[int, dict[str, Any]], file: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of a shard holding `states` (block index -> state) and its manifest entry."""
    buf = io.BytesIO()
    torch.save({"blocks": {str(i): s for i, s in states.items()}}, buf)
    data = buf.getvalue()
    return data, {"file": file, "sha256": hashlib.sha256(data).hexdigest(), "blocks": sorted(states)}


def write_shard_at(filesystem: Any, ckpt_dir: str, states: dict[int, dict[str, Any]],
                   file: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the states of some blocks (block index -> state) as one shard of directory `ckpt_dir` on a pyarrow
    `filesystem`; return its manifest entry."""
    data, entry = encode_shard(states, file or block_file(min(states)))
    filesystem.create_dir(ckpt_dir, recursive=True)
    with filesystem.open_output_stream(f"{ckpt_dir}/{entry['file']}") as f:
        f.write(data)
    return entry


def decode_shard(data: bytes, entry: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The block states in a shard's bytes (by str(index)), refused unless they hash to the manifest's
    SHA-256."""
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(
            f"checkpoint {where}: {entry['file']} does not match the SHA-256 in its manifest "
            "(changed or damaged after it was written); refusing to load it"
        )
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: the error below says what matters
            warnings.simplefilter("ignore")
            loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for what weights_only refuses; RuntimeError/EOFError when damaged
        raise CheckpointError(f"checkpoint {where}: {entry['file']} {_load_problem(e)}; refusing to load it") from None
    blocks = loaded.get("blocks") if isinstance(loaded, dict) else None
    if not isinstance(blocks, dict) or any(not isinstance(blocks.get(str(i)), dict) for i in entry["blocks"]):
        raise CheckpointError(f"checkpoint {where}: {entry['file']} does not hold the states of blocks "
                              f"{entry['blocks']} its manifest lists; it is damaged or not growpipe's")  # fmt: skip
    return blocks


def _load_problem(e: Exception) -> str:
    """Why torch.load(weights_only=True) refused a shard, in growpipe's words (never torch's hint to load it
    unsafely)."""
    text = str(e)
    if "Weights only load failed" in text:
        found = re.search(r"unsupported GLOBAL (\S+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (f"holds a pickled object{what}, not only tensors: it was not written by growpipe or was tampered "
                "with (its hash was made to match)")  # fmt: skip
    return f"is not a readable torch file ({type(e).__name__}: truncated or damaged)"


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
        self.fs, root = filesystem_of(uri)
        self.root = f"{root.rstrip('/')}/{run_name}"
        self.protected: set[str] = set()
        """Checkpoint directories `prune` leaves however old (the best epoch's, for model selection)."""
        self.pending: BackgroundWrite[CheckpointRef] | None = None
        """The checkpoint written in the background through this store (the newest; it may have ended)."""
        self._said: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a worker (its shards): without the write under way here (a thread, this process's)."""
        return {**self.__dict__, "pending": None}

    # ---- writing -----------------------------------------------------------------------------------------
    def dir_for(self, epoch: int, batch: int, seq: int) -> str:
        """The directory of checkpoint number `seq` at (completed epochs, next batch of the following epoch);
        the number keeps two checkpoints at one position (before and after a growth) apart."""
        return f"{self.root}/ckpt-{epoch:06d}-{batch:07d}-{seq:04d}"

    def write_shard(self, ckpt_dir: str, states: dict[int, dict[str, Any]], file: str | None = None) -> dict[str, Any]:
        """Write the states of some blocks (block index -> state) as one shard; return its manifest entry."""
        return write_shard_at(self.fs, ckpt_dir, states, file)

    def commit(self, ckpt_dir: str, manifest: dict[str, Any],
               say: Callable[[str], None] | None = None) -> CheckpointRef:  # fmt: skip
        """Write the manifest last (temporary name, then moved into place), then prune old checkpoints (`say`
        gets a line for each that could not be removed)."""
        body = json.dumps({"format_version": FORMAT_VERSION, "written_at": time.time(), **manifest}, indent=1)
        tmp = f"{ckpt_dir}/{WRITING}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(body.encode())
        self.fs.move(tmp, f"{ckpt_dir}/{MANIFEST}")
        self.prune(say)
        return CheckpointRef(ckpt_dir, manifest["epoch"], manifest["batch"], manifest["seq"])

    def commit_in_background(self, ckpt_dir: str, manifest: dict[str, Any],
                             write_shards: Callable[[], list[dict[str, Any]]], then: Callable[[CheckpointRef], None],
                             say: Callable[[str], None] | None = None) -> BackgroundWrite[CheckpointRef]:  # fmt: skip
        """Write checkpoint `ckpt_dir` on a thread of its own (`write_shards` returns the shard entries, then the
        manifest is committed, then `then(ref)`), once the write under way through this store has ended."""
        self.settle()

        def job() -> CheckpointRef:
            return self.commit(ckpt_dir, {**manifest, "shards": write_shards()}, say=say)

        self.pending = BackgroundWrite(job, then, ckpt_dir.rsplit("/", 1)[-1])
        return self.pending

    def settle(self) -> None:
        """Wait until the write under way through this store (if any) has ended, committed or not. Every read of the
        run's checkpoints through this store (complete, latest, read_manifest) settles first: the run never
        restores from a checkpoint a commit prunes meanwhile, nor misses one it wrote just before."""
        pending = self.pending
        if pending is not None and threading.current_thread() is not pending.thread:  # its report may read here
            pending.wait()

    def prune(self, say: Callable[[str], None] | None = None) -> None:
        """Remove what prune_plan says: keep the newest `keep` complete checkpoints, the `protected` ones and
        those a server claims. A checkpoint that cannot be removed (a read-only folder, files growpipe did not
        write) stays, said once through `say`: the run goes on."""
        dirs = self._dirs()
        try:
            entries = {path: self._entries(path) for path, _ in dirs}
        except OSError as e:
            if self.root not in self._said:
                self._said.add(self.root)
                (say or _no_line)(f"ckpt   old checkpoints not pruned: {self.root} cannot be read "
                                  f"({e.strerror or type(e).__name__}); the run goes on")  # fmt: skip
            return
        held = self.protected | {path for path, _ in dirs if self._claimed(path, entries[path])}
        plan = prune_plan([(path, pos, MANIFEST in entries[path]) for path, pos in dirs], self.keep, held)
        for path in plan:
            try:
                kept = self._remove(path, entries[path], honour_claims=True)
            except OSError as e:
                kept = f"could not be removed ({e.strerror or type(e).__name__}); it stays on disk, the run goes on"
            if kept and path not in self._said:
                self._said.add(path)
                (say or _no_line)(f"ckpt   old checkpoint {path.rpartition('/')[2]} {kept}")

    def clear(self) -> int:
        """Remove every checkpoint folder of this run (a fresh run reusing the name, --overwrite): growpipe's
        files only, after checking that no folder holds anything else (CheckpointError naming it); how many
        went."""
        dirs = [(path, self._entries(path)) for path, _ in self._dirs()]
        if foreign := [f"{path.rpartition('/')[2]}/{name}" for path, found in dirs
                       for name in own_entries(found, self._named(path, found))[1]]:  # fmt: skip
            raise CheckpointError(f"checkpoint.uri: {self.root} holds what growpipe did not write ({foreign[0]}); "
                                  "refusing to remove its checkpoints: move it away first")  # fmt: skip
        for path, found in dirs:
            self._remove(path, found, honour_claims=False)
        return len(dirs)

    def _remove(self, path: str, entries: dict[str, bool], honour_claims: bool) -> str | None:
        """Delete checkpoint folder `path`'s own files (own_entries), then the folder when nothing else is left;
        None when it went, else why it stays. `honour_claims`: the manifest is first moved aside (the checkpoint
        is no longer complete, so a server claiming it from now on sees it gone), then a claim written meanwhile
        keeps it (the manifest is put back)."""
        named = self._named(path, entries)
        if honour_claims and MANIFEST in entries:
            self.fs.move(f"{path}/{MANIFEST}", f"{path}/{RETIRING}")
            entries = self._entries(path)
            if self._claimed(path, entries):
                self.fs.move(f"{path}/{RETIRING}", f"{path}/{MANIFEST}")
                return None
        own, other = own_entries(entries, named)
        for name in own:
            with contextlib.suppress(FileNotFoundError):  # a claim its holder withdrew meanwhile
                self.fs.delete_file(f"{path}/{name}")
        if other:
            shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
            return f"kept: it holds what growpipe did not write ({shown}); only its checkpoint files were removed"
        self.fs.delete_dir(path)
        return None

    def highest_seq(self) -> int:
        """The highest sequence number of any checkpoint folder of the run (complete or not): a run resumed
        from an older checkpoint numbers its new ones past it, never into a folder that exists."""
        return max((pos[2] for _, pos in self._dirs()), default=0)

    def set_aside(self, ckpt_dir: str) -> None:
        """Make a damaged checkpoint incomplete (its manifest renamed to manifest.json.damaged), so no restore
        takes it; its files stay until pruning removes the folder."""
        self.fs.move(f"{ckpt_dir}/{MANIFEST}", f"{ckpt_dir}/{DAMAGED}")

    # ---- claims (a server holding the checkpoint it loads) --------------------------------------------
    def claim(self, ckpt_dir: str, holder: str, check: bool = True) -> bool:
        """Write (or refresh) `holder`'s claim on checkpoint `ckpt_dir`; whether the checkpoint is complete
        with the claim in place (False: the run removed it first, and the claim is withdrawn). `check=False`
        (refreshing a claim held all along): only whether the claim was written."""
        body = json.dumps({"holder": holder, "host": socket.gethostname(), "pid": os.getpid(),
                           "written_at": time.time()}).encode()  # fmt: skip
        tmp, final = f"{ckpt_dir}/{CLAIM_PREFIX}{holder}.tmp", f"{ckpt_dir}/{CLAIM_PREFIX}{holder}.json"
        try:
            with self.fs.open_output_stream(tmp) as f:
                f.write(body)
            self.fs.move(tmp, final)
        except OSError:  # the folder is gone
            return False
        if not check or self.fs.get_file_info(f"{ckpt_dir}/{MANIFEST}").type == fs.FileType.File:
            return True
        self.unclaim(ckpt_dir, holder)
        return False

    def unclaim(self, ckpt_dir: str, holder: str) -> None:
        """Withdraw `holder`'s claim on `ckpt_dir` (nothing when it is not there)."""
        for name in (f"{CLAIM_PREFIX}{holder}.json", f"{CLAIM_PREFIX}{holder}.tmp"):
            with contextlib.suppress(OSError):
                self.fs.delete_file(f"{ckpt_dir}/{name}")

    def _claimed(self, path: str, entries: dict[str, bool]) -> bool:
        """Whether a claim in checkpoint folder `path` still holds it (claim_holds)."""
        now, host = time.time(), socket.gethostname()
        for name in entries:
            if CLAIM.match(name):
                try:
                    with self.fs.open_input_stream(f"{path}/{name}") as f:
                        claim = json.loads(f.read().decode())
                except (OSError, ValueError):  # withdrawn meanwhile, or not a claim growpipe wrote
                    continue
                if claim_holds(claim, now, host, _pid_alive):
                    return True
        return False

    # ---- reading -----------------------------------------------------------------------------------------
    def foreign(self) -> list[str]:
        """What the run's folder holds that growpipe did not put there: anything but ckpt-* folders, and inside
        one anything but its own files (own_entries), as `ckpt-.../NAME`; a file where the folder should be is
        listed as itself."""
        info = self.fs.get_file_info(self.root)
        if info.type == fs.FileType.NotFound:
            return []
        if info.type != fs.FileType.Directory:
            return [self.root]
        out = []
        for e in self.fs.get_file_info(fs.FileSelector(self.root)):
            if not (NAME.match(e.base_name) and e.type == fs.FileType.Directory):
                out.append(e.base_name)
                continue
            found = self._entries(e.path)
            out += [f"{e.base_name}/{name}" for name in own_entries(found, self._named(e.path, found))[1]]
        return sorted(out)

    def _entries(self, path: str) -> dict[str, bool]:
        """What folder `path` holds: name -> whether it is a folder."""
        infos = self.fs.get_file_info(fs.FileSelector(path, allow_not_found=True))
        return {i.base_name: i.type == fs.FileType.Directory for i in infos}

    def _named(self, path: str, entries: dict[str, bool]) -> set[str] | None:
        """The shard files the manifest of checkpoint folder `path` names (also while it is being removed, or
        set aside as damaged); None when it has no readable manifest."""
        for name in (MANIFEST, RETIRING, DAMAGED):
            if name not in entries:
                continue
            try:
                with self.fs.open_input_stream(f"{path}/{name}") as f:
                    shards = json.loads(f.read().decode()).get("shards")
                return {e["file"] for e in shards if isinstance(e, dict) and isinstance(e.get("file"), str)}
            except (OSError, ValueError, AttributeError, TypeError):
                continue
        return None

    def _dirs(self) -> list[tuple[str, tuple[int, int, int]]]:
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
        """Complete checkpoints (their manifest exists), oldest first (a write under way here ended first)."""
        self.settle()
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
        """The manifest of a checkpoint directory in the current format's form (an older one upgraded); refused
        when damaged or of a format growpipe does not read."""
        path = ref.path if isinstance(ref, CheckpointRef) else ref
        self.settle()
        return _read_manifest(self.fs, path)

    def verify(self, ckpt_dir: str, load: bool = False) -> dict[str, Any]:
        """The manifest of checkpoint `ckpt_dir` once every shard it lists is there and hashes to its SHA-256
        (read in chunks: nothing is unpickled, no block is materialised); with `load` also every shard loaded
        (weights_only, one at a time, then dropped) and every block of the topology found: what any load of
        it will meet. CheckpointError otherwise."""
        manifest = self.read_manifest(ckpt_dir)
        shards = manifest.get("shards", [])
        for entry in shards:
            if load:
                load_states(self.fs, ckpt_dir, [entry], entry["blocks"])
                continue
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
        if load:
            topology = manifest.get("topology")
            if not isinstance(topology, list) or not all(isinstance(d, dict) and isinstance(d.get("index"), int)
                                                         for d in topology):  # fmt: skip
                raise CheckpointError(f"checkpoint {ckpt_dir}: manifest.json has no topology of blocks; it is damaged")
            for d in topology:
                shard_of(shards, d["index"], ckpt_dir)
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


def own_entries(entries: dict[str, bool], named: set[str] | None) -> tuple[list[str], list[str]]:
    """A checkpoint folder's entries (name -> is a folder) split into growpipe's files and everything else.
    growpipe's: the manifest (and its names while written, removed or set aside), claims, and the shard
    files the manifest names (`named`; None when the folder has no readable manifest, as a write cut short
    leaves it: files named as growpipe names shards). Only those are ever deleted."""
    own: list[str] = []
    other: list[str] = []
    for name, is_dir in sorted(entries.items()):
        ours = name in (MANIFEST, WRITING, RETIRING, DAMAGED) or name.startswith(CLAIM_PREFIX) or (
            name in named if named is not None else bool(SHARD_NAME.match(name)))  # fmt: skip
        (own if ours and not is_dir else other).append(name)
    return own, other


def claim_holds(claim: Any, now: float, host: str, alive: Callable[[int], bool], ttl_s: float = CLAIM_TTL_S) -> bool:
    """Whether a claim (its file's JSON: holder, host, pid, written_at) still holds its checkpoint at time
    `now` on machine `host`: refreshed within `ttl_s` (a time far ahead of `now` counts as stale too), and,
    when its holder runs on this machine, its process still there (`alive(pid)`)."""
    if not isinstance(claim, dict):
        return False
    written, pid = claim.get("written_at"), claim.get("pid")
    if isinstance(written, bool) or not isinstance(written, int | float) or abs(now - written) > ttl_s:
        return False
    return not (claim.get("host") == host and isinstance(pid, int) and not alive(pid))


def prune_plan(dirs: Sequence[tuple[str, Position, bool]], keep: int, held: set[str]) -> list[str]:
    """The checkpoint folders to remove; `dirs`: (path, position, complete), oldest first. Every folder
    (complete or left by a write cut short) older than the oldest of the newest `keep` complete ones goes,
    except `held` ones (the best epoch's; those a server claims), which do not count towards `keep` either."""
    complete = [pos for path, pos, done in dirs if done and path not in held]
    if not complete:
        return []
    oldest_kept = complete[-keep:][0]
    return [path for path, pos, _ in dirs if pos < oldest_kept and path not in held]


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _no_line(_line: str) -> None:
    pass


def _read_manifest(filesystem: Any, path: str) -> dict[str, Any]:
    try:
        with filesystem.open_input_stream(f"{path}/manifest.json") as f:
            data = f.read()
    except OSError:
        raise CheckpointError(f"checkpoint: {path} is not a checkpoint (no manifest.json)") from None
    return current_manifest(parse_manifest(data, path), path)


def open_checkpoint(path: str | Path) -> tuple[CheckpointStore, str, dict[str, Any]]:
    """A checkpoint directory given by the user: a `--save` directory, a run checkpoint (ckpt-...), or a
    run's checkpoint folder (its newest complete checkpoint); local or a pyarrow.fs URI.

    Returns (a store on its filesystem, the directory, its manifest)."""
    text = str(path)
    parent, _, name = text.rstrip("/").rpartition("/")
    store = CheckpointStore(parent or ".", name)  # the run folder, when `path` is one
    target = store.root
    if store.fs.get_file_info(f"{target}/manifest.json").type != fs.FileType.File:
        latest = store.latest()
        if latest is None:
            raise CheckpointError(
                f"checkpoint: {path} is not a checkpoint (no manifest.json, and no complete ckpt-* inside)"
            )
        target = latest.path
    return store, target, store.read_manifest(target)


# ---- whole nets (growpipe train --save, MLflow artifacts, Tune checkpoints) ------------------------------
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


def load_net(path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, dict[str, Any]]:
    """Rebuild the net of any checkpoint directory (see open_checkpoint) to answer with: from its manifest's
    specs and input alone (whatever its saved config says), its blocks' weights hash-checked (their optimizer
    states are not loaded). Returns (net, manifest)."""
    store, target, manifest = open_checkpoint(path)
    info = InputInfo.from_dict(manifest["input"])
    states = store.load_blocks(target, manifest["shards"], [d["index"] for d in manifest["topology"]])
    weights = [{**s, "optimizers": {}} for s in states]
    return GrowableNet.from_states(inference_rule(manifest), info, manifest["topology"], weights, device), manifest

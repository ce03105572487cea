"""Writes that never leave half a file behind (write to a temporary name beside the target, then rename), and
whether a path can be written at all (unwritable)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (the parent directory is created)."""
    return atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (the parent directory is created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_write_dir(path: str | Path, fill: Callable[[Path], None]) -> Path:
    """Create directory `path` by calling fill(tmp_dir) on a temporary sibling, then swapping it in.

    A failure inside `fill` leaves any previous `path` untouched and no temporary directory behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old: Path | None = None
    try:
        fill(tmp)
        for f in tmp.iterdir():
            _fsync(f)
            f.chmod(0o666 & ~_UMASK)
        tmp.chmod(0o777 & ~_UMASK)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():  # put the previous version back
            os.replace(old / path.name, path)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def unwritable(path: str | Path) -> str | None:
    """Why a file or directory cannot be created at `path` (None: it can): a probe file is created (and
    removed at once) in the nearest directory that exists, as root's permission bits say little."""
    p = Path(path).expanduser().absolute()
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory; choose another path"
    try:
        fd, probe = tempfile.mkstemp(prefix=".growpipe-probe-", dir=parent)
    except OSError as e:
        return f"{parent} is not writable ({e.strerror}); choose another path"
    os.close(fd)
    os.unlink(probe)
    return None

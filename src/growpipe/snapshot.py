"""A checkpoint written while training goes on (checkpoint.asynchronous): the state as it is now, copied in memory
(cpu_copy; a shard file's bytes), and the rest of the write on a thread of its own (BackgroundWrite). The format,
the commit and the store are growpipe.checkpoint's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")


def cpu_copy(obj: Any) -> Any:
    """The same nested structure with every tensor detached and copied to the CPU (a block's state as it is now,
    whatever trains on afterwards)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def read_files(filesystem: Any, folder: str, names: list[str]) -> dict[str, bytes]:
    """The bytes of files `names` of `folder` on a pyarrow `filesystem`, by name."""
    out = {}
    for name in names:
        with filesystem.open_input_stream(f"{folder}/{name}") as f:
            out[name] = f.read()
    return out


def write_files(filesystem: Any, folder: str, files: dict[str, bytes]) -> None:
    """Write `files` (name -> bytes) into `folder` (made when missing) on a pyarrow `filesystem`."""
    filesystem.create_dir(folder, recursive=True)
    for name, data in files.items():
        with filesystem.open_output_stream(f"{folder}/{name}") as f:
            f.write(data)


def copy_later(src_fs: Any, src_dir: str, shards: list[dict[str, Any]], dst_fs: Any,
               dst_dir: str) -> Callable[[], list[dict[str, Any]]]:  # fmt: skip
    """Shard files of checkpoint folder `src_dir` read into memory now (their folder may go meanwhile), written
    into `dst_dir` by the answer (any thread), which returns their manifest entries."""
    files = read_files(src_fs, src_dir, [entry["file"] for entry in shards])

    def write() -> list[dict[str, Any]]:
        write_files(dst_fs, dst_dir, files)
        return list(shards)

    return write


class BackgroundWrite(Generic[T]):
    """A write on a thread of its own: `job` (a checkpoint's shards, then its manifest last: CheckpointStore.commit),
    then `then(its answer)` (the run reports the checkpoint). Once it has ended (`wait`): `result` when the job
    returned, else `error` (a checkpoint then has no manifest: the previous one stays the newest complete one)."""

    def __init__(self, job: Callable[[], T], then: Callable[[T], None], name: str):
        self.name = name
        self.result: T | None = None
        self.error: BaseException | None = None
        self._job: Callable[[], T] | None = job
        self._then = then
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"write {name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            assert self._job is not None
            self.result = self._job()
            self._then(self.result)
        except BaseException as e:  # handed to the run's thread (loop.checkpointing raises it at its next write)
            self.error = e
        finally:
            self._job = None  # what it wrote from (a copy of every block's state): not kept past the write
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the write has ended (at most `timeout` seconds); whether it has."""
        return self._done.wait(timeout)

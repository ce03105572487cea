"""The files a command writes (--json-out, --plot-out, --trace-out, --save, --write): growpipe replaces its own
earlier output, atomically, and never a file or folder it did not write.

What growpipe wrote carries a mark: a JSON object's `written_by` field, a PNG's `Software` text chunk, a YAML
file's first comment line; a checkpoint directory is one with a readable `manifest.json`. An empty file or an
empty folder is taken over too (nothing is lost).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from growpipe.errors import OutputError
from growpipe.fsutil import atomic_write_bytes, atomic_write_dir, atomic_write_text, unwritable
from growpipe.manifest import is_saved_net
from growpipe.version import __version__

Kind = Literal["json", "png", "yaml", "checkpoint"]
MARK = f"growpipe {__version__}"
YAML_HEADER = "# written by growpipe"
LEGACY_RESULT_KEYS = {"method", "dataset", "blocks", "adaptive"}
"""A result or evaluation JSON of a growpipe from before the mark."""


def is_own(path: Path, kind: Kind) -> bool:
    """Whether the existing `path` is growpipe's own output of this kind (or empty), so it may be replaced."""
    if kind == "checkpoint":
        return path.is_dir() and (not any(path.iterdir()) or is_saved_net(path))
    if not path.is_file():
        return False
    if path.stat().st_size == 0:
        return True
    try:
        if kind == "json":
            obj = json.loads(path.read_text())
            return isinstance(obj, dict) and (str(obj.get("written_by", "")).startswith("growpipe")
                                              or obj.keys() >= LEGACY_RESULT_KEYS)  # fmt: skip
        if kind == "png":
            with Image.open(path) as im:
                return str(getattr(im, "text", {}).get("Software", "")).startswith("growpipe")
        return path.read_text().startswith(YAML_HEADER)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    except Exception:  # PIL's UnidentifiedImageError and the like: not a PNG growpipe wrote
        return False


def output_problem(flag: str, path: str | Path, kind: Kind) -> str | None:
    """Why `flag` may not write `path` (None: it may): a folder where a file goes (or a file where a folder
    goes), something growpipe did not write, or a place that cannot be written."""
    p = Path(path).expanduser().absolute()
    what = "a checkpoint directory" if kind == "checkpoint" else f"a {kind.upper()} file"
    if p.exists():
        if kind != "checkpoint" and p.is_dir():
            return f"{flag} {p}: is a folder; give the path of {what}, e.g. {p / ('out.' + kind)}"
        if kind == "checkpoint" and not p.is_dir():
            return f"{flag} {p}: is a file, not a folder; give a new folder (or an earlier --save) for the checkpoint"
        if not is_own(p, kind):
            held = "holds files growpipe did not write" if p.is_dir() else "is a file growpipe did not write"
            return f"{flag} {p}: {held}; refusing to replace it: give a new path, or move it away first"
    why = unwritable(p)
    return f"{flag} {p}: {why}" if why else None


def check_outputs(outputs: dict[str, tuple[str | None, Kind]]) -> list[str]:
    """The problems of every output a command will write (flag -> (path or None, kind)), one line each: each
    path on its own, and two outputs on one path (or one inside the other)."""
    given = [(flag, Path(path).expanduser().absolute(), kind) for flag, (path, kind) in outputs.items() if path]
    problems = [why for flag, p, kind in given if (why := output_problem(flag, p, kind))]
    for i, (flag_a, a, _) in enumerate(given):
        for flag_b, b, _ in given[i + 1 :]:
            if a == b or a in b.parents or b in a.parents:
                problems.append(f"{flag_a} {a} and {flag_b} {b}: one output would overwrite the other; give each "
                                "its own path")  # fmt: skip
    return problems


def ensure_replaceable(flag: str, path: str | Path, kind: Kind) -> None:
    """OutputError unless `path` may be written now (checked again right before each write: something may
    have appeared there since the run started)."""
    if why := output_problem(flag, path, kind):
        raise OutputError(why)


@contextlib.contextmanager
def _writing(flag: str, path: str | Path) -> Iterator[None]:
    """A failed write (a full disk, say) as one line; the atomic writers left any earlier file in place."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{flag} {path}: could not be written ({e.strerror or e}); whatever was there before "
                          "is untouched: free some space or choose another path") from None  # fmt: skip


def write_json(path: str | Path, obj: dict[str, Any], flag: str = "--json-out") -> Path:
    """Write `obj` (with its `written_by` mark) as indented JSON, atomically."""
    ensure_replaceable(flag, path, "json")
    with _writing(flag, path):
        return atomic_write_text(path, json.dumps({**obj, "written_by": MARK}, indent=2) + "\n")


def write_yaml(path: str | Path, text: str, what: str, flag: str = "--write") -> Path:
    """Write YAML `text` under a first comment line that marks it as growpipe's (`what`: what it is)."""
    ensure_replaceable(flag, path, "yaml")
    with _writing(flag, path):
        return atomic_write_text(path, f"{YAML_HEADER} {__version__}: {what}\n{text}")


def write_png(path: str | Path, fig: Any, flag: str = "--plot-out") -> Path:
    """Save a matplotlib figure as PNG (its Software chunk marks it as growpipe's), atomically."""
    ensure_replaceable(flag, path, "png")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": MARK})
    with _writing(flag, path):
        return atomic_write_bytes(path, buf.getvalue())


def write_checkpoint_dir(path: str | Path, fill: Callable[[Path], None], flag: str = "--save") -> Path:
    """Create checkpoint directory `path` with fill(tmp_dir), replacing only an earlier checkpoint (atomically)."""
    ensure_replaceable(flag, path, "checkpoint")
    with _writing(flag, path):
        return atomic_write_dir(path, fill)

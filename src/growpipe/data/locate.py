"""Where a named dataset's files are: data.root when set, else $GROWPIPE_DATA_DIR, any shared/data above the
current directory or this package, then system directories."""

from __future__ import annotations

from pathlib import Path

from growpipe import envvars
from growpipe.config import DataSpec
from growpipe.errors import DataNotFoundError


def candidate_dirs(name: str, system_dirs: tuple[str, ...] = ()) -> list[Path]:
    """Where a dataset called `name` may live: $GROWPIPE_DATA_DIR, any ../shared/data above cwd or
    this package, then system directories."""
    out: list[Path] = []
    env = envvars.data_dir()
    if env:
        out.append(Path(env) / name)
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in (start, *start.parents):
            out.append(parent / "shared" / "data" / name)
    out.extend(Path(d) for d in system_dirs)
    return list(dict.fromkeys(out))  # each once, in order


def locate(spec: DataSpec, name: str, must_have: list[str], system_dirs: tuple[str, ...] = ()) -> Path:
    """The directory holding `must_have` files: data.root if set, else the first candidate that has them."""
    if spec.root is not None:
        root = Path(spec.root).expanduser()
        if not root.is_dir():
            raise DataNotFoundError(f"data.root: {root} does not exist; point it at the directory of the {name} files")
        missing = [f for f in must_have if not (root / f).is_file()]
        if missing:
            raise DataNotFoundError(f"data.root: {root} lacks {', '.join(missing)}; point it at the {name} directory")
        return root
    tried = candidate_dirs(name, system_dirs)
    for d in tried:
        if all((d / f).is_file() for f in must_have):
            return d
    shown = ", ".join(str(p) for p in [*tried[:2], *map(Path, system_dirs)])
    raise DataNotFoundError(
        f"data: no {name} files found (looked in {shown}, ...); set data.root or ${envvars.GROWPIPE_DATA_DIR}"
    )

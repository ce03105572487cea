"""Whether a run's data is there, looked for from this process before any actor starts: the folders and files
its first stage will open, found without reading them (a missing file is otherwise found only once the stage
actors run)."""

from __future__ import annotations

from pathlib import Path

from growpipe.config import DataSpec
from growpipe.errors import DataError


def data_problem(spec: DataSpec) -> str | None:
    """Why the data `spec` names cannot be found from here (None: it is found, or only reading it can tell:
    the bundled digits, a download, a Hugging Face Hub name)."""
    try:
        find_data(spec)
    except DataError as e:
        return str(e)
    return None


def find_data(spec: DataSpec) -> None:
    """Raise the DataNotFoundError the loader of `spec` would, without reading the data."""
    from growpipe.data import sources
    from growpipe.data.images import open_fs

    name = spec.name
    if name == "fashion-mnist" and not spec.download:
        sources.locate(spec, name, list(sources.FASHION_FILES.values()), sources.FASHION_SYSTEM_DIRS)
    elif name == "20newsgroups":
        sources.locate(spec, name, sources.NEWSGROUPS_FILES)
    elif name.startswith(("parquet:", "csv:", "json:")):
        sources.find_table_files(name)
    elif name.startswith("imagefolder:"):
        uri = name.removeprefix("imagefolder:")
        fs, root = open_fs(uri)
        if not fs.isdir(root):
            raise DataError(f"data.name: {uri} is not a directory; give imagefolder:DIR with train/CLASS/*.png and "
                            "test/CLASS/*.png")  # fmt: skip
    elif name.startswith("hf:"):
        local = name.removeprefix("hf:")
        if local.startswith(("/", "./", "../", "~")) and not Path(local).expanduser().is_dir():
            raise DataError(f"data.name: {local} is not a directory; give hf:DIR of a saved dataset or a Hub name")

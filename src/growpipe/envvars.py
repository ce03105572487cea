"""Every environment variable growpipe reads, declared once."""

import os

GROWPIPE_DATA_DIR = "GROWPIPE_DATA_DIR"
"""A directory whose subfolders (fashion-mnist/, 20newsgroups/, cifar10/...) hold the datasets."""


def data_dir() -> str | None:
    """The value of GROWPIPE_DATA_DIR, if set and non-empty."""
    return os.environ.get(GROWPIPE_DATA_DIR) or None

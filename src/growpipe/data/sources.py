"""Readers for each data source: bundled digits, IDX files, CIFAR, parquet text, Hugging Face datasets.

The names the registry (growpipe.data), the data checks (presence.py), tests and benches import, one module per
source family: where files are (locate), image sets (image_sources), table files (table_files), Hugging Face
datasets (hf_source); the bundle builders they share (assemble, frames, labels)."""

from __future__ import annotations

from growpipe.data.assemble import image_bundle, streamed_bundle
from growpipe.data.frames import frames_to_bundle
from growpipe.data.hf_source import load_hf
from growpipe.data.image_sources import (
    DIGITS_SPLIT,
    FASHION_CLASSES,
    FASHION_FILES,
    FASHION_SYSTEM_DIRS,
    digits_rows,
    load_cifar,
    load_digits_bundle,
    load_fashion_mnist,
    load_imagefolder,
    read_idx,
)
from growpipe.data.locate import candidate_dirs, locate
from growpipe.data.table_files import (
    NEWSGROUPS_FILES,
    find_table_files,
    load_files,
    load_newsgroups,
    peek_table_files,
    unreadable,
)

__all__ = [
    "DIGITS_SPLIT",
    "FASHION_CLASSES",
    "FASHION_FILES",
    "FASHION_SYSTEM_DIRS",
    "NEWSGROUPS_FILES",
    "candidate_dirs",
    "digits_rows",
    "find_table_files",
    "frames_to_bundle",
    "image_bundle",
    "load_cifar",
    "load_digits_bundle",
    "load_fashion_mnist",
    "load_files",
    "load_hf",
    "load_imagefolder",
    "load_newsgroups",
    "locate",
    "peek_table_files",
    "read_idx",
    "streamed_bundle",
    "unreadable",
]

"""growpipe's version as installed: a module of its own, so any module can name it without importing the
package (whose attributes import the Python API)."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("growpipe")
except metadata.PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

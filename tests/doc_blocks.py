"""The documentation's fenced blocks and the marker above each: what the docs tests run or skip.

A command block (```bash, ```sh, ```python, ```yaml) carries, on the line directly above its fence, either
    <!-- doc: run as KEY -->                  tests/test_docs.py runs it (its runner named KEY), as written
    <!-- doc: not run here: REASON -->       it cannot run on this machine (a Kubernetes cluster, a GPU ...)
A block without a language is a picture (a diagram, a program's output) and holds no command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ["jobs/README.md", "raylocal/README.md", "k8s/README.md", "tune_configs/README.md", "bench/README.md"]
DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")), *PAGES]
"""The documents whose blocks are held to this."""

COMMAND_LANGUAGES = {"bash", "sh", "python", "yaml"}
MARKER = re.compile(r"^<!-- doc: (run as (?P<key>[\w.-]+)|not run here: (?P<reason>.+?)) -->$")
COMMAND_START = re.compile(
    r"^\s*(\$ )?(\.venv/bin/|growpipe |python|make |ray |raylocal/|kubectl |curl |helm |docker )"
)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    key: str | None  # run as KEY
    reason: str | None  # not run here: REASON

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    """Every fenced block of `doc` (a path relative to the repo)."""
    lines = (REPO / doc).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        marker = MARKER.match(lines[start - 1].strip()) if start > 0 else None
        key, reason = (marker.group("key"), marker.group("reason")) if marker else (None, None)
        out.append(Block(doc, start + 1, language, "\n".join(lines[start + 1 : j]), key, reason))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def block(key: str) -> Block:
    """The block marked `run as KEY` (exactly one)."""
    found = [b for b in all_blocks() if b.key == key]
    assert len(found) == 1, f"{len(found)} blocks are marked 'run as {key}'"
    return found[0]


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped (a `#` inside
    quotes stays)."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        stripped = _without_comment(current).strip()
        if stripped:
            out.append(stripped)
        current = ""
    return out


def _without_comment(line: str) -> str:
    """`line` up to a `#` that starts a comment (outside quotes, after white space or at the start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def argv(command: str) -> list[str]:
    return shlex.split(command)

"""The one way the benchmark scripts write their results into the README: the text between a
script's two HTML comment markers is replaced by the new block (``--write-readme README.md``)."""
from __future__ import annotations

import re
from pathlib import Path


def replace_block(path: str, begin: str, end: str, block: str, what: str = "the table") -> None:
    """Put ``block`` between the ``begin`` and ``end`` markers of the file at ``path``; SystemExit when
    the file has no such pair."""
    text = Path(path).read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {begin} ... {end} block to replace")
    Path(path).write_text(pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text))
    print(f"wrote {what} into {path}")

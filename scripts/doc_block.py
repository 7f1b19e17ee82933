"""Generated blocks in the docs: the text between two marker comments is a benchmark's, every
other line is written by hand and kept as it is."""

from __future__ import annotations

from pathlib import Path


def replace_block(page: str, block: str, begin: str, end: str) -> str:
    """`page` with the text between `begin` and the first `end` after it replaced by `block`."""
    start = page.find(begin)
    stop = page.find(end, start + len(begin)) if start >= 0 else -1
    if stop < 0:
        raise ValueError(f"no {begin} ... {end} block to replace")
    return f"{page[: start + len(begin)]}\n{block}\n{page[stop:]}"


def write_block(path: Path, block: str, begin: str, end: str, *, append: bool = False) -> None:
    """Rewrite the generated block of `path`; with `append`, a page without one (or no page yet)
    gets it at its end."""
    page = path.read_text() if path.exists() else ""
    if append and begin not in page:
        page = (page.rstrip("\n") + "\n\n" if page.strip() else "") + f"{begin}\n{end}\n"
    path.write_text(replace_block(page, block, begin, end))

"""torchrun's argument parser of any torch release, without installing that torch.

A torch wheel is about 1 GB; the launcher's parser lives in a few small Python files. This module
reads only those zip members out of a wheel on PyPI with HTTP Range requests (the End Of Central
Directory record from the tail, then the central directory, then each member's local header and
compressed data) and rebuilds ``torch.distributed.run.get_args_parser`` from them in isolation:
``run.py`` is parsed with ``ast`` and the function is exec'd, in a namespace holding exactly the
module-level names it reads (found with ``symtable``), each rebuilt the same way from the module
that defines it. Nothing of torch is imported. For 2.5 .. 2.15 those names are:

- ``ArgumentParser``, ``REMAINDER`` (2.14+: ``Action``): the real ``argparse``;
- ``env``, ``check_env``: ``torch/distributed/argparse_util.py`` of that version, exec'd whole
  on its own (it imports only ``os`` and ``argparse``; ``env`` reads ``PET_*`` from the real
  ``os.environ`` at parser construction, as torchrun does);
- 2.9+: ``_AffinityMode``, the ``AffinityMode`` enum of ``torch/numa/binding.py`` (the
  choices of ``--numa-binding``), just that class statement, with the real ``enum.Enum``;
- 2.14+: ``_PrintCompletionAction``, run.py's own class (``--print-completion``).

Stand-ins: none for any name the parser reads; any name that cannot be rebuilt this way raises
``IsolationError`` rather than being guessed. The one substitute is ``__import__`` inside the
rebuilt code, which allows the standard library only: 2.14+'s ``get_args_parser`` does
``try: import shtab`` to pick ``--print-completion``'s choices, and gets ImportError, i.e. the
parser is the one torchrun builds where the optional ``shtab`` is not installed (choices
``bash, zsh, tcsh``). It affects no other option.

``python -m tests.compat.torch_launchers [VERSION ...]`` prints every long option of torchrun
and the first of the given versions (default: the newest patch of each minor from 2.5 on) whose
parser has it.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import json
import struct
import symtable
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PYPI = "https://pypi.org/pypi/torch"
RUN = "torch/distributed/run.py"
ARGPARSE_UTIL = "torch/distributed/argparse_util.py"
# Always needed; fetch_sources adds what get_args_parser reads from other modules (2.9+:
# torch/numa/binding.py). Nothing of torch.distributed.elastic (e.g. multiprocessing.Std) is read
# while building the parser: those conversions happen later, in run.py's config_from_args.
PARSER_MEMBERS = (RUN, ARGPARSE_UTIL)
MIN_VERSION = (2, 5)
TIMEOUT_S = 60
_INDEX = "_wheel.json"  # per-version cache of the chosen wheel's URL and central directory


class FetchError(RuntimeError):
    """PyPI or its file host could not be reached, or answered something unusable."""


class IsolationError(RuntimeError):
    """get_args_parser of a version uses a name this module cannot provide faithfully."""


# --------------------------------------------------------------------------------------------
# HTTP


def _open(url: str, headers: dict[str, str] | None = None):
    request = urllib.request.Request(
        url, headers={"User-Agent": "torch-launchers/1", **(headers or {})}
    )
    try:
        # urllib follows redirects and keeps the Range header on the redirected request.
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"cannot reach {url}: {exc}") from exc


def _get_json(url: str) -> dict[str, Any]:
    with _open(url) as response:
        return json.load(response)


def _get_range(url: str, start: int, length: int | None = None) -> bytes:
    """Bytes [start, start+length) of url; start < 0 with length None: the last -start bytes."""
    spec = f"bytes={start}" if start < 0 else f"bytes={start}-{start + length - 1}"
    try:
        with _open(url, {"Range": spec}) as response:
            if response.status != 206:
                raise FetchError(f"{url} ignored the Range header (HTTP {response.status})")
            data = response.read()
    except urllib.error.HTTPError as exc:
        raise FetchError(f"GET {url} ({spec}): HTTP {exc.code}") from exc
    if length is not None and len(data) != length:
        raise FetchError(f"{url} ({spec}): got {len(data)} bytes, expected {length}")
    return data


# --------------------------------------------------------------------------------------------
# PyPI


def _release_files(version: str) -> tuple[list[dict[str, Any]], str]:
    """The files of one torch release and the URL their (possibly relative) URLs are relative to.

    The per-version JSON endpoint first; some PyPI mirrors serve only the project-level JSON, so
    on a 404 its ``releases[version]`` is used instead.
    """
    for url in (f"{PYPI}/{version}/json", f"{PYPI}/json"):
        try:
            data = _get_json(url)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            raise FetchError(f"GET {url}: HTTP {exc.code}") from exc
        files = data["urls"] if url.endswith(f"/{version}/json") else data["releases"].get(version)
        if files:
            return files, url
    raise FetchError(f"PyPI has no torch {version} (or no files for it)")


def _pick_wheel(version: str) -> str:
    files, base = _release_files(version)
    wheels = [f for f in files if f["filename"].endswith(".whl") and not f.get("yanked")]
    if not wheels:
        raise FetchError(f"torch {version} has no wheel on PyPI")
    smallest = min(wheels, key=lambda f: (f.get("size") or 1 << 62, f["filename"]))
    return urllib.parse.urljoin(base, smallest["url"])


def torch_releases() -> list[str]:
    """Every final torch release on PyPI from MIN_VERSION on, oldest first."""
    try:
        data = _get_json(f"{PYPI}/json")
    except urllib.error.HTTPError as exc:
        raise FetchError(f"GET {PYPI}/json: HTTP {exc.code}") from exc
    versions = [v for v, files in data["releases"].items() if files and _is_final(v)]
    return sorted((v for v in versions if _key(v)[:2] >= MIN_VERSION), key=_key)


def newest_patches(versions: Iterable[str]) -> list[str]:
    newest: dict[tuple[int, ...], str] = {}
    for v in sorted(versions, key=_key):
        newest[_key(v)[:2]] = v
    return [newest[k] for k in sorted(newest)]


def _is_final(version: str) -> bool:
    return all(part.isdigit() for part in version.split("."))


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# --------------------------------------------------------------------------------------------
# Zip members over HTTP Range

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"


def _central_directory(url: str) -> dict[str, list[int]]:
    """name -> [local header offset, compressed size, uncompressed size, method, crc32]."""
    tail = _get_range(url, -(22 + 0xFFFF + 20))  # EOCD + longest comment + ZIP64 locator
    at = tail.rfind(_EOCD)
    if at < 0:
        raise FetchError(f"{url}: no End Of Central Directory record in the last {len(tail)} bytes")
    entries, cd_size, cd_offset = struct.unpack_from("<10xHII", tail, at)
    if 0xFFFFFFFF in (cd_size, cd_offset) or entries == 0xFFFF:
        loc = at - 20
        if loc < 0 or tail[loc : loc + 4] != _EOCD64_LOCATOR:
            raise FetchError(f"{url}: ZIP64 archive without a ZIP64 locator")
        (eocd64_offset,) = struct.unpack_from("<8xQ", tail, loc)
        eocd64 = _get_range(url, eocd64_offset, 56)
        if eocd64[:4] != _EOCD64:
            raise FetchError(f"{url}: bad ZIP64 End Of Central Directory record")
        entries, cd_size, cd_offset = struct.unpack_from("<32xQQQ", eocd64)
    cd = _get_range(url, cd_offset, cd_size)
    members: dict[str, list[int]] = {}
    pos = 0
    for _ in range(entries):
        if cd[pos : pos + 4] != _CENTRAL:
            raise FetchError(f"{url}: bad central directory entry at +{pos}")
        (method, crc, csize, usize, nlen, xlen, clen, offset) = struct.unpack_from(
            "<10xH4xIIIHHH8xI", cd, pos
        )
        name = cd[pos + 46 : pos + 46 + nlen].decode("utf-8")
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + xlen]
        if 0xFFFFFFFF in (csize, usize, offset):
            csize, usize, offset = _zip64_sizes(extra, csize, usize, offset)
        members[name] = [offset, csize, usize, method, crc]
        pos += 46 + nlen + xlen + clen
    return members


def _zip64_sizes(extra: bytes, csize: int, usize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            values = iter(struct.unpack_from(f"<{size // 8}Q", extra, pos + 4))
            usize = next(values) if usize == 0xFFFFFFFF else usize
            csize = next(values) if csize == 0xFFFFFFFF else csize
            offset = next(values) if offset == 0xFFFFFFFF else offset
            break
        pos += 4 + size
    return csize, usize, offset


def _read_member(url: str, name: str, entry: list[int]) -> bytes:
    offset, csize, usize, method, crc = entry
    slack = 512  # the local header's extra field usually matches the central one; re-read if not
    blob = _get_range(url, offset, 30 + len(name.encode()) + slack + csize)
    if blob[:4] != _LOCAL:
        raise FetchError(f"{url}: no local header for {name} at {offset}")
    nlen, xlen = struct.unpack_from("<26xHH", blob)
    start = 30 + nlen + xlen
    if start + csize > len(blob):
        blob = _get_range(url, offset, start + csize)
    raw = blob[start : start + csize]
    if method == 0:
        data = raw
    elif method == 8:
        data = zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw)
    else:
        raise FetchError(f"{url}: {name} uses compression method {method}")
    if len(data) != usize or zlib.crc32(data) != crc:
        raise FetchError(f"{url}: {name} inflated to bad data (size or CRC mismatch)")
    return data


def _index(version: str, cache: Path) -> dict[str, Any]:
    path = cache / version / _INDEX
    if path.is_file():
        return json.loads(path.read_text())
    url = _pick_wheel(version)
    index = {"wheel": url, "members": _central_directory(url)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index))
    tmp.replace(path)
    return index


def fetch_members(
    version: str, names: Iterable[str], cache: Path, *, missing_ok: bool = False
) -> dict[str, Path]:
    """Cache the given wheel members of torch ``version`` under ``cache/<version>/<name>``.

    Returns name -> cached path; a member the wheel lacks raises KeyError, or is left out of the
    result with ``missing_ok``. Members already cached cost no network at all.
    """
    cache = Path(cache)
    names = list(names)
    out: dict[str, Path] = {}
    todo = []
    for name in names:
        path = cache / version / name
        if path.is_file():
            out[name] = path
        else:
            todo.append(name)
    if not todo:
        return out
    index = _index(version, cache)
    for name in todo:
        entry = index["members"].get(name)
        if entry is None:
            if missing_ok:
                continue
            raise KeyError(f"torch {version} wheel has no {name}")
        data = _read_member(index["wheel"], name, entry)
        path = cache / version / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        out[name] = path
    return out


def member_names(version: str, cache: Path, prefix: str = "") -> list[str]:
    """Names in the wheel of torch ``version`` (from the cached central directory) under prefix."""
    return sorted(n for n in _index(version, Path(cache))["members"] if n.startswith(prefix))


def fetch_sources(version: str, cache: Path) -> Path:
    """Cache what torchrun's parser of ``version`` needs; return ``cache/<version>``.

    That is run.py and argparse_util.py, plus every torch module whose definitions
    ``get_args_parser`` reads at module level (found by rebuilding it, see ``_Loader``): from
    2.9 on ``torch/numa/binding.py``, whose ``AffinityMode`` enum gives ``--numa-binding`` its
    choices. Once cached, no call makes a network request.
    """
    fetch_members(version, PARSER_MEMBERS, cache)
    _Loader(version, cache).get("torch.distributed.run", "get_args_parser")
    return Path(cache) / version


# --------------------------------------------------------------------------------------------
# The parser in isolation


def _module_member(module: str) -> tuple[str, str]:
    """Wheel member names a torch module may live in: ``a/b.py`` and ``a/b/__init__.py``."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def _free_names(node: ast.AST) -> set[str]:
    """Names a top-level statement reads from module globals (symtable's view of its code)."""
    table = symtable.symtable(ast.unparse(node), "<snippet>", "exec")
    names: set[str] = set()
    stack = [table]
    while stack:
        scope = stack.pop()
        names.update(
            s.get_name() for s in scope.get_symbols() if s.is_global() and not s.is_local()
        )
        stack.extend(scope.get_children())
    return names


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return (
            isinstance(stmt.target, ast.Name) and stmt.target.id == name and stmt.value is not None
        )
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in stmt.names)
    return False


def _restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` of the isolated code: the standard library only.

    Anything else (torch itself, or the optional ``shtab`` that torch 2.14+'s parser tries to
    import for ``--print-completion`` choices) raises ModuleNotFoundError, so the parser is the one
    torchrun builds where shtab is not installed.
    """
    if level == 0 and name.partition(".")[0] in sys.stdlib_module_names:
        return __import__(name, globals, locals, fromlist, level)
    raise ModuleNotFoundError(f"No module named {name!r} (isolated torchrun parser)", name=name)


_BUILTINS = {**vars(builtins), "__import__": _restricted_import}


class _Loader:
    """Module-level names of one torch version's sources, rebuilt without importing torch.

    A name defined in a torch module by ``def``/``class``/assignment is rebuilt by exec'ing just
    that statement (compiled from the cached file, so tracebacks point at it) in a namespace of
    that module that holds the names the statement reads, themselves rebuilt the same way. A name
    imported from the standard library is imported; one imported from another torch module is
    looked up there (fetched on demand). A torch module whose own imports are all standard
    library (``argparse_util.py``) is exec'd whole, on its own. Anything else is refused.
    """

    def __init__(self, version: str, cache: Path) -> None:
        self.version = version
        self.cache = Path(cache)
        self.trees: dict[str, tuple[ast.Module, Path]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.used: dict[str, set[str]] = {}  # module -> names rebuilt from it

    def _tree(self, module: str) -> tuple[ast.Module, Path]:
        if module not in self.trees:
            candidates = _module_member(module)
            cached = [self.cache / self.version / c for c in candidates]
            found = {str(c): c for c in cached if c.is_file()} or fetch_members(
                self.version, candidates, self.cache, missing_ok=True
            )
            if not found:
                raise IsolationError(f"torch {self.version} has no module {module}")
            path = next(iter(found.values()))
            self.trees[module] = (ast.parse(path.read_bytes(), str(path)), path)
        return self.trees[module]

    def _namespace(self, module: str) -> dict[str, Any]:
        if module not in self.namespaces:
            tree, path = self._tree(module)
            ns: dict[str, Any] = {
                "__name__": module,
                "__file__": str(path),
                "__builtins__": _BUILTINS,
            }
            self.namespaces[module] = ns
            if self._stdlib_only(tree):
                exec(compile(tree, str(path), "exec"), ns)
                self.used.setdefault(module, set()).add("*")
        return self.namespaces[module]

    @staticmethod
    def _stdlib_only(tree: ast.Module) -> bool:
        for stmt in tree.body:
            if isinstance(stmt, ast.Import):
                mods = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom):
                mods = [stmt.module or ""] if stmt.level == 0 else ["."]
            else:
                continue
            if any(m.partition(".")[0] not in sys.stdlib_module_names for m in mods):
                return False
        return True

    def get(self, module: str, name: str) -> Any:
        ns = self._namespace(module)
        if name in ns:
            return ns[name]
        tree, path = self._tree(module)
        stmt = next((s for s in reversed(tree.body) if _binds(s, name)), None)
        if stmt is None:
            if hasattr(builtins, name):
                return getattr(builtins, name)
            raise IsolationError(f"torch {self.version}: {module} does not define {name}")
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            value = self._imported(module, stmt, name)
        else:
            for free in sorted(_free_names(stmt) - {name}):
                if free not in ns and not (
                    hasattr(builtins, free) and not self._defines(tree, free)
                ):
                    ns[free] = self.get(module, free)
            futures = [
                s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"
            ]
            code = compile(ast.Module(body=[*futures, stmt], type_ignores=[]), str(path), "exec")
            exec(code, ns)
            value = ns[name]
            self.used.setdefault(module, set()).add(name)
        ns[name] = value
        return value

    @staticmethod
    def _defines(tree: ast.Module, name: str) -> bool:
        return any(_binds(s, name) for s in tree.body)

    def _imported(self, module: str, stmt: ast.Import | ast.ImportFrom, name: str) -> Any:
        alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
        if isinstance(stmt, ast.Import):
            target = alias.name
            if target.partition(".")[0] in sys.stdlib_module_names:
                return importlib.import_module(name)
            raise IsolationError(f"torch {self.version}: {module} uses module {target} itself")
        source = stmt.module or ""
        if stmt.level:
            package = module.rsplit(".", stmt.level)[0]
            source = f"{package}.{source}" if source else package
        if source.partition(".")[0] in sys.stdlib_module_names:
            return getattr(importlib.import_module(source), alias.name)
        if source.partition(".")[0] == "torch":
            return self.get(source, alias.name)
        raise IsolationError(f"torch {self.version}: {module} imports {alias.name} from {source}")


def parser_for(version: str, cache: Path) -> argparse.ArgumentParser:
    """torchrun's parser of torch ``version``: ``get_args_parser()`` of its run.py, in isolation."""
    fetch_members(version, PARSER_MEMBERS, cache)
    loader = _Loader(version, cache)
    get_args_parser = loader.get("torch.distributed.run", "get_args_parser")
    parser = get_args_parser()
    parser.isolation = {m: sorted(n) for m, n in loader.used.items()}  # what was rebuilt, for tests
    return parser


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def first_versions(versions: Iterable[str], cache: Path) -> dict[str, tuple[str, str | None]]:
    """Long option -> (first version having it, first later version lacking it or None)."""
    seen: dict[str, tuple[str, str | None]] = {}
    for version in sorted(versions, key=_key):
        options = long_options(parser_for(version, cache))
        for option in options:
            seen.setdefault(option, (version, None))
        for option, (first, gone) in seen.items():
            if option not in options and gone is None:
                seen[option] = (first, version)
    return seen


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(
        prog="python -m tests.compat.torch_launchers",
        description="Every long option of torchrun and the first given torch version having it.",
    )
    cli.add_argument("versions", nargs="*", help="default: newest patch of each minor from 2.5")
    cli.add_argument(
        "--cache",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "build" / "torch-launchers",
    )
    args = cli.parse_args(argv)
    try:
        versions = args.versions or newest_patches(torch_releases())
        table = first_versions(versions, args.cache)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"torchrun long options, torch {', '.join(sorted(versions, key=_key))}")
    width = max(map(len, table))
    for option, (first, gone) in sorted(table.items(), key=lambda kv: (_key(kv[1][0]), kv[0])):
        print(f"{option:<{width}}  {first}" + (f"  (gone in {gone})" if gone else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

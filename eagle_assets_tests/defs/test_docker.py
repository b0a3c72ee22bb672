"""Deployment files: the compose file passes `docker compose config`, every dagster.*.yaml
passes Dagster's own instance schema and its classes' config schemas, and the images pin the
versions pyproject.toml pins. Its open doors stay shut: the UI and the engine are published on
127.0.0.1 unless EAGLE_ASSETS_BIND opts in, the database password has no default, the engine
requires an API key that never reaches a command line, no image runs as root, and none forces
--trust-remote-code. No Docker engine runs here; nothing is built."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes import ConfigurableClassData, class_from_code_pointer

from eagle_assets.paths import PROJECT_ROOT

DOCKER = PROJECT_ROOT / "docker"
INSTANCE_FILES = sorted(DOCKER.glob("dagster.*.yaml")) + [PROJECT_ROOT / "dagster.yaml"]
POSTGRES_ENV = {
    "DAGSTER_POSTGRES_HOST": "postgres",
    "DAGSTER_POSTGRES_DB": "dagster",
    "DAGSTER_POSTGRES_USER": "dagster",
    "DAGSTER_POSTGRES_PASSWORD": "secret",
    "DAGSTER_K8S_NAMESPACE": "eagle",
}


def _compose() -> list[str]:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine: `docker compose config` cannot run")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(
            "the docker client has no compose plugin (`docker compose`); install docker-compose-plugin "
            "or link a Compose v2 binary into ~/.docker/cli-plugins/docker-compose"
        )
    return [docker, "compose", "-f", str(DOCKER / "docker-compose.yaml")]


def compose_config(compose: list[str], *args: str, **variables: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **variables}
    out = subprocess.run([*compose, *args, "config", "--format", "json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["services"]


def test_compose_config_passes_and_names_the_services():
    compose = _compose()
    services = compose_config(compose, DAGSTER_POSTGRES_PASSWORD="secret")
    assert set(services) == {"postgres", "pipeline", "webserver", "daemon"}  # the engine waits for --profile gpu
    assert services["webserver"]["ports"][0]["target"] == 3000
    assert services["pipeline"]["environment"]["DAGSTER_POSTGRES_HOST"] == "postgres"
    for name in ("pipeline", "webserver", "daemon"):
        dockerfile = Path(services[name]["build"]["context"]) / services[name]["build"]["dockerfile"]
        assert dockerfile.is_file(), dockerfile

    engine = compose_config(compose, "--profile", "gpu", DAGSTER_POSTGRES_PASSWORD="secret")["engine"]
    assert engine["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_the_database_password_has_no_default():
    compose = _compose()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run([*compose, "config"], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "required variable DAGSTER_POSTGRES_PASSWORD is missing a value" in out.stderr, out.stderr
    services = compose_config(compose, DAGSTER_POSTGRES_PASSWORD="s3cret-pw")
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "s3cret-pw"
    assert {services[name]["environment"]["DAGSTER_POSTGRES_PASSWORD"] for name in ("pipeline", "webserver", "daemon")} == {"s3cret-pw"}


@pytest.mark.parametrize("bind", [None, "0.0.0.0"])
def test_the_ui_and_the_engine_are_published_on_localhost_unless_the_user_opts_in(bind):
    compose = _compose()
    opt_in = {"EAGLE_ASSETS_BIND": bind} if bind else {}
    services = compose_config(compose, "--profile", "gpu", DAGSTER_POSTGRES_PASSWORD="pw", **opt_in)
    published = {name: [(p["host_ip"], p["target"]) for p in s.get("ports", [])] for name, s in services.items()}
    host = bind or "127.0.0.1"
    assert published == {"postgres": [], "pipeline": [], "webserver": [(host, 3000)], "daemon": [], "engine": [(host, 8000)]}
    assert "ipc" not in services["engine"] and int(services["engine"]["shm_size"]) >= 2**30  # no sharing of the host's IPC namespace


def test_the_engine_takes_its_key_from_the_environment_and_the_pipeline_sends_it():
    compose = _compose()
    services = compose_config(compose, "--profile", "gpu", DAGSTER_POSTGRES_PASSWORD="pw", EAGLE_ASSETS_API_KEY="k3y-in-env")
    assert services["engine"]["environment"]["EAGLE_ASSETS_ENGINE_API_KEY"] == "k3y-in-env"
    assert services["pipeline"]["environment"]["EAGLE_ASSETS_SERVER_API_KEY"] == "k3y-in-env"
    assert "k3y-in-env" not in json.dumps(services["engine"].get("command")) + json.dumps(services["engine"].get("entrypoint"))


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in dockerfile.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(m[1].upper(), m[2]) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, flags=re.M)]


@pytest.mark.parametrize("dockerfile", sorted(DOCKER.glob("Dockerfile.*")), ids=lambda p: p.name)
def test_every_image_runs_as_an_unprivileged_user_and_trusts_no_remote_code(dockerfile):
    steps = _instructions(dockerfile)
    users = [args.strip() for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0"), (dockerfile.name, users)
    last_user = max(i for i, (op, _) in enumerate(steps) if op == "USER")
    assert all(op not in ("RUN",) for op, _ in steps[last_user + 1 :]), "nothing is installed as the user after USER"
    assert not [args for _, args in steps if "--trust-remote-code" in args]  # the engines pass it per preset
    commands = [args for op, args in steps if op == "CMD"]
    if dockerfile.name.startswith("Dockerfile.engine-"):
        engine = dockerfile.name.removeprefix("Dockerfile.engine-")
        assert json.loads(commands[-1]) == ["/opt/eagle_assets/.venv/bin/python", "/opt/eagle_assets/docker/engine_serve.py", engine]


@pytest.mark.parametrize("path", INSTANCE_FILES, ids=lambda p: p.name)
def test_instance_files_pass_dagsters_schema(path, tmp_path, monkeypatch):
    for key, value in POSTGRES_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    shutil.copyfile(path, tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))  # raises DagsterInvalidConfigError on a bad key
    raw = yaml.safe_load(path.read_text())
    # Each pluggable class must exist and accept its config (Dagster checks these only when it starts).
    for section in ("run_launcher", "run_coordinator", "compute_logs"):
        if section in raw:
            spec = raw[section]
            # Dagster's own reading of module/class (it maps the public dagster.core.* names).
            data = ConfigurableClassData(spec["module"], spec["class"], yaml.dump(spec.get("config") or {}))
            if importlib.util.find_spec(data.module_name.split(".")[0]) is None:
                pytest.skip(f"{data.module_name} is not installed here: `pip install -e '.[deploy]'` checks {section} of {path.name}")
            cls = class_from_code_pointer(data.module_name, data.class_name)
            result = process_config(cls.config_type(), spec.get("config") or {})
            assert result.success, (path.name, section, [e.message for e in result.errors])
    if "postgres" in raw.get("storage", {}):
        pytest.importorskip("dagster_postgres", reason="`pip install -e '.[deploy]'` checks the Postgres storage config")
        from dagster_postgres import DagsterPostgresStorage

        result = process_config(DagsterPostgresStorage.config_type(), raw["storage"]["postgres"])
        assert result.success, [e.message for e in result.errors]
        assert result.value["postgres_db"]["password"] == "secret"  # read from the environment, not the file
    assert config


def test_instance_files_queue_runs_one_at_a_time_and_retry_when_asked():
    """Every instance queues its runs (the daemon launches them), one at a time (they write one
    data folder), and retries a failed run that asks for it (the automation's do)."""
    for path in INSTANCE_FILES:
        config = yaml.safe_load(path.read_text())
        coordinator = config["run_coordinator"]
        assert coordinator["class"] == "QueuedRunCoordinator", path.name
        assert coordinator["config"]["max_concurrent_runs"] == 1, path.name
        assert config["run_retries"] == {"enabled": True, "max_retries": 0}, path.name


def test_a_misspelt_instance_key_is_refused(tmp_path):
    (tmp_path / "dagster.yaml").write_text("run_cordinator:\n  module: dagster.core.run_coordinator\n  class: QueuedRunCoordinator\n")
    with pytest.raises(Exception, match="run_cordinator"):
        dagster_instance_config(str(tmp_path))


def test_images_pin_the_versions_pyproject_pins():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(
        re.match(r"([A-Za-z0-9_-]+)==(\S+)", d).groups() for d in project["dependencies"] + project["optional-dependencies"]["deploy"] if "==" in d
    )
    dagster_image = (DOCKER / "Dockerfile.dagster").read_text()
    for name, version in re.findall(r"(dagster[a-z-]*)==(\S+)", dagster_image):
        if name in pins:
            assert pins[name] == version, (name, version, pins[name])
    assert f"dagster=={pins['dagster']}" in dagster_image
    assert f"torch=={pins['torch']}" in (DOCKER / "Dockerfile.pipeline").read_text()
    assert "vllm/vllm-openai:v0.32.0" in (DOCKER / "Dockerfile.engine-vllm").read_text()  # engines/envs.py: vllm==0.32.0
    for dockerfile in DOCKER.glob("Dockerfile.*"):
        for source in re.findall(r"^COPY (\S+)", dockerfile.read_text(), flags=re.M):
            assert (PROJECT_ROOT / source).exists(), (dockerfile.name, source)


ENGINE_SERVE = DOCKER / "engine_serve.py"
# Config files alone, matched to their presets by shape (eagle_assets/targets): SmolLM2, which runs its own
# code, and Kimi-K2.5, whose preset asks for trust_remote_code.
SMOLLM2_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "vocab_size": 49152,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
}
KIMI_SHAPE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "vocab_size": 163840,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "intermediate_size": 18432,
}


def engine_serve(engine: str, target: Path, **variables: str) -> subprocess.CompletedProcess:
    """docker/engine_serve.py --dry-run, as the engine image runs it (the command it would exec is printed)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(target.parent), "PYTHONPATH": str(PROJECT_ROOT), "EAGLE_ASSETS_TARGET_PATH": str(target), **variables}
    return subprocess.run([sys.executable, str(ENGINE_SERVE), engine, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)


def target_folder(tmp_path: Path, shape: dict) -> Path:
    folder = tmp_path / shape["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(shape))
    return folder


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engine_image_serves_only_behind_a_key_that_stays_off_the_command_line(engine, tmp_path):
    target = target_folder(tmp_path, SMOLLM2_SHAPE)
    refused = engine_serve(engine, target)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "the engine serves only behind an API key: set EAGLE_ASSETS_ENGINE_API_KEY" in refused.stderr
    on_the_command_line = engine_serve(engine, target, EAGLE_ASSETS_ENGINE_API_KEY="k", EAGLE_ASSETS_ENGINE_ARGS="--api-key k")
    assert on_the_command_line.returncode == 1 and "EAGLE_ASSETS_ENGINE_ARGS has --api-key" in on_the_command_line.stderr

    key_file = tmp_path / "engine_api_key"
    key_file.write_text("f1le-k3y\n")
    for variables in ({"EAGLE_ASSETS_ENGINE_API_KEY": "env-k3y"}, {"EAGLE_ASSETS_ENGINE_API_KEY_FILE": str(key_file)}):
        key = variables.get("EAGLE_ASSETS_ENGINE_API_KEY", "f1le-k3y")
        out = engine_serve(engine, target, **variables, DAGSTER_POSTGRES_PASSWORD="pg", AWS_SECRET_ACCESS_KEY="aws")
        assert out.returncode == 0, out.stderr
        plan = json.loads(out.stdout)
        assert key not in " ".join(plan["argv"])
        assert plan["api_key_sha256"] == hashlib.sha256(key.encode()).hexdigest()
        assert ("VLLM_API_KEY" if engine == "vllm" else "EAGLE_ASSETS_ENGINE_API_KEY") in plan["env"]
        assert not {"DAGSTER_POSTGRES_PASSWORD", "AWS_SECRET_ACCESS_KEY", "EAGLE_ASSETS_ENGINE_API_KEY_FILE"} & set(plan["env"])
        assert plan["argv"][plan["argv"].index("--host") + 1] == "0.0.0.0"  # the container's interface; compose publishes it on 127.0.0.1
        assert "--trust-remote-code" not in plan["argv"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engine_image_trusts_remote_code_only_where_the_preset_asks(engine, tmp_path):
    out = engine_serve(engine, target_folder(tmp_path, KIMI_SHAPE), EAGLE_ASSETS_ENGINE_API_KEY="k", EAGLE_ASSETS_TP="")
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)["argv"]
    assert "--trust-remote-code" in argv
    assert argv[argv.index("--tensor-parallel-size" if engine == "vllm" else "--tp") + 1] == "8"  # the preset's, EAGLE_ASSETS_TP left empty

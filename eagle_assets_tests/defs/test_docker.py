"""Deployment files: the compose file passes `docker compose config`, every dagster.*.yaml
passes Dagster's own instance schema and its classes' config schemas, and the images pin the
versions pyproject.toml pins. No Docker engine runs here; nothing is built."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
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
        pytest.skip("the docker client has no compose plugin (`docker compose`); install docker-compose-plugin "
                    "or link a Compose v2 binary into ~/.docker/cli-plugins/docker-compose")  # fmt: skip
    return [docker, "compose", "-f", str(DOCKER / "docker-compose.yaml")]


def test_compose_config_passes_and_names_the_services():
    compose = _compose()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run([*compose, "config", "--format", "json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    assert set(services) == {"postgres", "pipeline", "webserver", "daemon"}  # the engine waits for --profile gpu
    assert services["webserver"]["ports"][0]["target"] == 3000
    assert services["pipeline"]["environment"]["DAGSTER_POSTGRES_HOST"] == "postgres"
    for name in ("pipeline", "webserver", "daemon"):
        dockerfile = Path(services[name]["build"]["context"]) / services[name]["build"]["dockerfile"]
        assert dockerfile.is_file(), dockerfile

    gpu = subprocess.run([*compose, "--profile", "gpu", "config", "--format", "json"], capture_output=True, text=True, env=env)
    assert gpu.returncode == 0, gpu.stderr
    engine = json.loads(gpu.stdout)["services"]["engine"]
    assert engine["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


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


def test_instance_files_queue_runs_under_the_local_files_limits():
    """Every instance queues its runs (the daemon launches them) with one run of a retraining wave
    at a time; where runs share one host (local, Compose, Celery's run workers), one Hugging Face
    extraction at a time, as dagster.yaml has it. Kubernetes runs each get a pod of their own."""
    for path in INSTANCE_FILES:
        coordinator = yaml.safe_load(path.read_text())["run_coordinator"]
        assert coordinator["class"] == "QueuedRunCoordinator", path.name
        limits = {(limit["key"], limit.get("value")): limit["limit"] for limit in coordinator["config"]["tag_concurrency_limits"]}
        assert limits[("eagle_assets/retrain", None)] == 1, path.name
        if path.name != "dagster.k8s.yaml":
            assert limits[("eagle_assets/extraction", "hf")] == 1, path.name


def test_a_misspelt_instance_key_is_refused(tmp_path):
    (tmp_path / "dagster.yaml").write_text("run_cordinator:\n  module: dagster.core.run_coordinator\n  class: QueuedRunCoordinator\n")
    with pytest.raises(Exception, match="run_cordinator"):
        dagster_instance_config(str(tmp_path))


def test_images_pin_the_versions_pyproject_pins():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(re.match(r"([A-Za-z0-9_-]+)==(\S+)", d).groups() for d in project["dependencies"] + project["optional-dependencies"]["deploy"] if "==" in d)
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

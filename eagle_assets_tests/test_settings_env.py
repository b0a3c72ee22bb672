"""The environment readers: typed values, refusals that name the variable, and one place that reads.

The command-line behaviour of each variable is in test_bad_inputs.py; here, the readers' own
rules and that no module reads an EAGLE_ASSETS_* variable around them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle_assets import settings_env
from eagle_assets.settings_env import SettingError, env_choice, env_flag, env_int, env_list, env_path, env_secret, env_str

PACKAGE = Path(settings_env.__file__).resolve().parent
NAME = "EAGLE_ASSETS_TEST_SETTING"


def test_unset_and_empty_give_the_default(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert (env_int(NAME, 4, min=1), env_flag(NAME), env_str(NAME, "d"), env_list(NAME)) == (4, False, "d", [])
    monkeypatch.setenv(NAME, "  ")  # compose passes ${VAR:-} through as empty
    assert (env_int(NAME, 4, min=1), env_flag(NAME, True), env_choice(NAME, "a", ["a", "b"])) == (4, True, "a")


@pytest.mark.parametrize(
    "value, on", [("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("false", False), ("no", False), ("off", False)]
)
def test_flags_take_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv(NAME, value)
    assert env_flag(NAME) is on


@pytest.mark.parametrize(
    "read, value, message",
    [
        (lambda: env_flag(NAME), "maybe", f"{NAME}='maybe' is neither on nor off: set it to 1 (on) or 0 (off)"),
        (lambda: env_int(NAME, 4, min=1), "four", f"{NAME}='four' is not a whole number >= 1"),
        (lambda: env_int(NAME, 4, min=1), "0", f"{NAME}=0 is out of range: it must be a whole number >= 1"),
        (lambda: env_int(NAME, 8000, min=1, max=65535), "70000", "a whole number from 1 to 65535"),
        (lambda: env_choice(NAME, "a", ["a", "b"]), "c", f"{NAME}='c' is not one of a, b"),
        (lambda: env_str(NAME, check=str.isdigit, expect="digits"), "x1", f"{NAME}='x1' is not digits"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_way_back(monkeypatch, read, value, message):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(SettingError, match=re.escape(message)) as info:
        read()
    assert "unset it" in str(info.value)


def test_a_folder_setting_refuses_files_and_what_lies_under_them(monkeypatch, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("")
    monkeypatch.setenv(NAME, str(tmp_path / "new" / "folder"))
    assert env_path(NAME, tmp_path) == tmp_path / "new" / "folder"  # created by whoever writes into it
    for value, kind in (
        (a_file, "is not a folder (a file)"),
        (a_file / "below", f"{a_file} above it is a file"),
        ("/dev/null", "a character device"),
    ):
        monkeypatch.setenv(NAME, str(value))
        with pytest.raises(SettingError, match=re.escape(kind)):
            env_path(NAME, tmp_path)


def test_a_secret_comes_from_the_variable_or_the_file_its_FILE_variable_names(monkeypatch, tmp_path):
    monkeypatch.setenv(NAME, "from-env")
    monkeypatch.delenv(f"{NAME}_FILE", raising=False)
    assert env_secret(NAME) == "from-env"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    monkeypatch.setenv(f"{NAME}_FILE", str(key))
    assert env_secret(NAME) == "from-file"  # the file wins, its newline dropped
    key.write_text("\n")
    with pytest.raises(SettingError, match=f"{NAME}_FILE='{re.escape(str(key))}' is empty"):
        env_secret(NAME)
    monkeypatch.setenv(f"{NAME}_FILE", str(tmp_path / "missing"))
    with pytest.raises(SettingError, match=f"{NAME}_FILE=.*missing' cannot be read \\(FileNotFoundError"):
        env_secret(NAME)


def test_every_project_variable_is_read_through_the_readers_and_listed():
    # The engine's own modules (engines/engine_site) run in the engine's environment, where the
    # readers cannot be imported; the pipeline has read and checked each value before the launch.
    engine_site = PACKAGE / "engines" / "engine_site"
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "settings_env.py" and engine_site not in p.parents}
    in_engine = {m for p in engine_site.glob("*.py") for m in re.findall(r"EAGLE_ASSETS_[A-Z_]+", p.read_text())}
    assert in_engine <= set(settings_env.VARIABLES), sorted(in_engine - set(settings_env.VARIABLES))
    direct = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p, text in sources.items()
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(r"os\.environ|getenv", line) and "EAGLE_ASSETS_" in line
    ]
    assert direct == []
    read = {m for text in sources.values() for m in re.findall(r'env_\w+\(\s*"(EAGLE_ASSETS_[A-Z_]+)"', text)}
    assert read and read <= set(settings_env.VARIABLES), sorted(read - set(settings_env.VARIABLES))
    everywhere = "\n".join(sources.values())
    unused = [name for name in settings_env.VARIABLES if name not in everywhere and name.replace("_VENV", "") not in everywhere]
    assert unused == []


def test_the_readmes_table_lists_every_variable_and_no_other():
    readme = (PACKAGE.parent / "README.md").read_text()
    rows = re.findall(r"^\| `(EAGLE_ASSETS_[A-Z_]+)` \|", readme, re.M)
    assert sorted(rows) == sorted(settings_env.VARIABLES)  # add or drop the row with the variable

"""The profile loader against hostile files (issue 28, items 8 and 13-17): special files, bytes that are not
UTF-8, YAML types no schema field means, values that would break a command line, extends outside the profiles,
and a file too large to parse. Every one is a clear one-line error from the library and from the commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigstack.errors import UserError
from rigstack.profiles import PROFILES_DIR, load_profile
from rigstack.render import serve_command
from rigstack.versions import REPO_ROOT


def error_of(path: Path | str) -> str:
    with pytest.raises(UserError) as caught:
        load_profile(path)
    return str(caught.value)


def command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m rigstack ...` as a user runs it, with a wide terminal so each message stays one line."""
    return subprocess.run([sys.executable, "-m", "rigstack", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "500"})


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "bug:" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / f"{name}.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# -- item 8 (profiles): every profile path is a regular file, read with a bound ------------------------------------
@pytest.mark.timeout(60)  # in-process: a FIFO read without a writer would hang the worker
@pytest.mark.parametrize("kind, expected", [
    ("directory", "a directory, not a regular file"),
    ("fifo", "a FIFO (named pipe), not a regular file"),
    ("zero", "a character device, not a regular file"),
    ("dangling", "a symlink to {tmp}/gone.yaml, which does not exist"),
    ("loop", "a symlink loop"),
])
def test_special_files_are_named_not_missing(tmp_path: Path, kind: str, expected: str) -> None:
    path = tmp_path / "odd.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # reading it without a writer would hang for ever
    elif kind == "zero":
        path.symlink_to("/dev/zero")  # reading it without a bound would fill the memory
    elif kind == "dangling":
        path.symlink_to(tmp_path / "gone.yaml")
    else:
        path.symlink_to(tmp_path / "odd.yaml")
    began = time.monotonic()
    message = error_of(path)
    assert time.monotonic() - began < 10
    assert message.startswith(f"profile {path}: {expected.format(tmp=tmp_path)}; name a profile's YAML file"), message
    # The same file extended by name, beside a profile: named as what it is, never "no profile named odd" (the
    # device is refused sooner, as a file outside the profile's folder).
    child = write(tmp_path, "child", "extends: odd\n")
    named = "extends: odd is outside" if kind == "zero" else f"profile {path}: {expected.format(tmp=tmp_path)}"
    assert named in error_of(child)


def test_a_device_as_a_profile_on_the_command_line(tmp_path: Path) -> None:
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    assert one_line(command("preflight", "--profile", str(link))) == (
        f"error: profile {link}: a character device, not a regular file; name a profile's YAML file "
        "(`python -m rigstack preflight profiles` lists them)")  # named as it was run (issue 29 item 9)
    assert one_line(command("preflight", "--profile", str(tmp_path))).startswith(
        f"error: profile {tmp_path}: a directory, not a regular file")


# -- item 13: bytes that are not UTF-8 ----------------------------------------------------------------------------
def test_a_profile_that_is_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, "latin", b"extends: cpu-tiny\ndescription: caf\xe9 rig\n")
    expected = (f"profile {path}:2: not UTF-8 text (byte 0xe9 at column 17); save the file as UTF-8")
    assert error_of(path) == expected
    for args in (("preflight", "--profile", str(path)), ("plan", "--profile", str(path))):
        assert one_line(command(*args)) == f"error: {expected}"
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--profile", str(path), "--dry-run"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "500"})
    assert one_line(done) == f"error: {expected}"


# -- item 14: YAML's other types are refused, never rendered as Python reprs ---------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("vllm:\n  dtype: !!binary aGVsbG8=\n", ":3: a !!binary value; a profile holds text, numbers, true/false"),
    ("vllm:\n  ignore-patterns: !!set {a, b}\n", ":3: a !!set value"),
    ("vllm:\n  kernel-config: !!omap [{a: 1}]\n", ":3: a !!omap value"),
    ("model:\n  path: tiny:dense\n  served_name: m\n  revision: !!timestamp 2026-01-02\n", ":5: a !!timestamp value"),
    ("vllm:\n  dtype: !custom bf16\n", ":3: a !custom value"),
])
def test_yaml_types_no_field_means(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "typed", "extends: cpu-tiny\n" + text)
    assert error_of(path).startswith(f"{path}{expected}")


def test_an_unquoted_date_stays_the_text_written(tmp_path: Path) -> None:
    path = write(tmp_path, "dated", "extends: cpu-tiny\nmodel:\n  path: tiny:dense\n  served_name: m\n"
                                    "  revision: 2026-01-02\nvllm:\n  revision: 2001-12-14t21:59:43.10-05:00\n")
    profile = load_profile(path)
    assert profile.model.revision == "2026-01-02"
    argv = serve_command(profile, model=Path("/m")).argv
    assert argv[argv.index("--revision") + 1] == "2001-12-14t21:59:43.10-05:00"


@pytest.mark.parametrize("text, expected", [
    ("port: true\n", ":2: port: Input should be a valid integer, not the boolean true"),
    ("router:\n  port: false\n", ":3: router.port: Input should be a valid integer, not the boolean false"),
    ("parallel:\n  tp: yes\n", ":3: parallel.tp: Input should be a valid integer, not the boolean true"),
    ("hardware:\n  memory_gib: true\n", ":3: hardware.memory_gib: Input should be a valid number, not the boolean"),
    ("parallel:\n  partition: [true]\n  pp: 1\n", ":3: parallel.partition.0: Input should be a valid integer, not"),
    ('port: "8000"\n', ':2: port: Input should be a valid integer, not the text "8000"'),
    ("model:\n  path: tiny:dense\n  served_name: 5\n", ":4: model.served_name: Input should be a valid string"),
])
def test_values_are_the_types_the_schema_names(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "typed", "extends: cpu-tiny\n" + text)
    assert error_of(path).startswith(f"{path}{expected}")


# -- item 15: no line break or tab reaches an argv word or an env value --------------------------------------------
@pytest.mark.parametrize("text, key", [
    ('model:\n  path: "/m\\n--trust-remote-code"\n  served_name: m\n', "model.path"),
    ('model:\n  path: tiny:dense\n  served_name: "m\\n--x"\n', "model.served_name"),
    ("model:\n  path: tiny:dense\n  served_name: |\n    m\n    --x\n", "model.served_name"),  # a block scalar
    ('env:\n  FOO: "a\\nb"\n', "env.FOO"),
    ('vllm:\n  tokenizer: "/t\\t--x"\n', "vllm.tokenizer"),
    ('vllm:\n  ignore-patterns: [a, "b\\nc"]\n', "vllm.ignore-patterns"),
    ('host: "0.0.0.0\\n"\n', "host"),
    ('image: "img\\n--privileged"\n', "image"),
    ('docker:\n  memory: "4g\\n"\n', "docker.memory"),
])
def test_line_breaks_outside_the_description(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, "broken", "extends: cpu-tiny\n" + text)
    message = error_of(path)
    assert f": {key}: the value holds a " in message and "only description may" in message, message


@pytest.mark.parametrize("text", ['env:\n  "FOO\\n": x\n', 'vllm:\n  "max-num-seqs\\n": 4\n'])
def test_a_key_with_a_trailing_newline(tmp_path: Path, text: str) -> None:
    """`$` in a pattern matches before a final newline: the names are matched whole."""
    path = write(tmp_path, "keyed", "extends: cpu-tiny\n" + text)
    assert "not an environment variable name" in error_of(path) or "write long flag names" in error_of(path)


def test_the_description_may_span_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "prose", "extends: cpu-tiny\ndescription: |\n  two lines\n  \tof prose\n")
    assert load_profile(path).description == "two lines\n\tof prose\n"


# -- item 16: extends names a profile, nothing else --------------------------------------------------------------
def test_extends_cannot_leave_the_profiles(tmp_path: Path) -> None:
    (tmp_path / "rigs" / "sub").mkdir(parents=True)
    outside = write(tmp_path, "secret", "description: not a profile of this folder\n")
    for parent in ("../../../etc/passwd", "/etc/passwd", "../secret.yaml", str(outside), "sub/../../secret.yaml"):
        path = write(tmp_path / "rigs", "evil", f"extends: {parent}\n")
        assert error_of(path) == (f"{path}:1: extends: {parent} is outside {tmp_path / 'rigs'} and {PROFILES_DIR}; "
                                  "extends names a profile in profiles/ or a file under the profile's own folder")
    (tmp_path / "rigs" / "sneaky.yaml").symlink_to(outside)  # a name whose file lies elsewhere
    path = write(tmp_path / "rigs", "evil", "extends: sneaky\n")
    assert "extends: sneaky is outside" in error_of(path)


def test_extends_paths_under_the_own_folder_and_names_in_profiles(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "base", "extends: cpu-tiny\nport: 8123\n")  # a name found in profiles/
    path = write(tmp_path, "over", "extends: sub/base.yaml\nhealth_timeout_s: 60\n")
    profile = load_profile(path)
    assert (profile.port, profile.health_timeout_s) == (8123, 60)
    assert profile.source_files == (str(PROFILES_DIR / "cpu-tiny.yaml"), str(tmp_path / "sub" / "base.yaml"),
                                    str(path))


# -- item 17: a size bound before parsing ------------------------------------------------------------------------
def test_a_huge_profile_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = write(tmp_path, "huge", "extends: cpu-tiny\n" + "# a comment line of the kind that costs PyYAML time\n"
                 * 200_000)  # 10 MB: 35-44 s to parse before
    began = time.process_time()
    assert error_of(path) == (f"profile {path}: 9.9 MiB (10,400,018 bytes), over the 256 KiB (262,144 bytes) "
                              "limit; name a profile's YAML file "
                              "(`python preflight.py profiles` lists them)")
    assert time.process_time() - began < 1.0

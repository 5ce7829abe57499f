"""The CLI's re-execution with glibc's huge-page tunable (jaxrl_llm.hugepages)."""

import os
import subprocess
import sys

import pytest

from jaxrl_llm import cli, hugepages
from jaxrl_llm.hugepages import TUNABLE, environment_with_hugepages, thp_mode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "text, mode",
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]\n", "never"),
        ("always madvise never\n", None),
    ],
)
def test_thp_mode_reads_the_bracketed_word(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_mode(str(path)) == mode


def test_thp_mode_is_none_without_the_file(tmp_path):
    assert thp_mode(str(tmp_path / "missing")) is None


def test_glibc_version_is_a_pair_or_none():
    version = hugepages.glibc_version()
    assert version is None or (len(version) == 2 and all(isinstance(v, int) for v in version))


def test_the_tunable_is_added_in_madvise_mode_on_a_recent_glibc():
    env = environment_with_hugepages({"A": "1"}, "madvise", (2, 36))
    assert env == {"A": "1", "GLIBC_TUNABLES": TUNABLE}


def test_other_tunables_are_kept():
    env = environment_with_hugepages(
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", (2, 35)
    )
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"


@pytest.mark.parametrize(
    "environ, thp, glibc",
    [
        ({"GLIBC_TUNABLES": TUNABLE}, "madvise", (2, 36)),  # already set: no loop
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", (2, 36)),  # the user's choice
        ({"JAXRL_LLM_HUGEPAGES": "0"}, "madvise", (2, 36)),
        ({"JAXRL_LLM_HUGEPAGES": "off"}, "madvise", (2, 36)),
        ({}, "always", (2, 36)),
        ({}, "never", (2, 36)),
        ({}, None, (2, 36)),
        ({}, "madvise", (2, 34)),
        ({}, "madvise", None),
    ],
)
def test_nothing_to_do(environ, thp, glibc):
    assert environment_with_hugepages(environ, thp, glibc) is None


def test_a_bad_opt_out_value_is_named():
    with pytest.raises(ValueError, match="JAXRL_LLM_HUGEPAGES='maybe'"):
        environment_with_hugepages({"JAXRL_LLM_HUGEPAGES": "maybe"}, "madvise", (2, 36))


_CHILD = """
import os, sys
from jaxrl_llm import hugepages
hugepages.thp_mode = lambda: "madvise"
hugepages.glibc_version = lambda: (2, 36)
print("RUN", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
hugepages.reexec_with_hugepages()
print("AFTER", flush=True)
"""


def test_reexec_runs_the_same_command_once_with_the_tunable():
    env = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "JAXRL_LLM_HUGEPAGES")
    }
    env["PYTHONPATH"] = ROOT
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "x", "--y=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    first, second = lines[0].split(" ", 2), lines[1].split(" ", 2)
    assert first[0] == second[0] == "RUN"
    assert first[1] == second[1]  # exec keeps the process (its pid, signals, parent)
    assert first[2] == "None ['x', '--y=1']"
    assert second[2] == f"{TUNABLE} ['x', '--y=1']"
    assert lines[2] == "AFTER"  # the second process does not execute again


def test_the_cli_reexecutes_only_as_a_program(monkeypatch):
    calls = []
    monkeypatch.setattr(hugepages, "reexec_with_hugepages", lambda: calls.append(1))
    monkeypatch.setattr(cli, "_sample", lambda args: 0)
    assert cli.main(["sample", "ckpt", "--prompt", "x"]) == 0
    assert calls == []
    monkeypatch.setattr(sys, "argv", ["jaxrl-llm", "sample", "ckpt", "--prompt", "x"])
    assert cli.main() == 0
    assert calls == [1]


def test_the_cli_names_a_bad_opt_out_value(monkeypatch, capsys):
    monkeypatch.setenv("JAXRL_LLM_HUGEPAGES", "maybe")
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(hugepages, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(sys, "argv", ["jaxrl-llm", "sample", "ckpt", "--prompt", "x"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "JAXRL_LLM_HUGEPAGES='maybe'" in capsys.readouterr().err


def test_a_failed_exec_warns_and_returns(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("JAXRL_LLM_HUGEPAGES", raising=False)
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(hugepages, "glibc_version", lambda: (2, 36))

    def refuse(*args):
        raise PermissionError("not allowed")

    monkeypatch.setattr(os, "execve", refuse)
    with pytest.warns(RuntimeWarning, match="could not restart with glibc.malloc.hugetlb=1"):
        hugepages.reexec_with_hugepages(["/bin/true"])

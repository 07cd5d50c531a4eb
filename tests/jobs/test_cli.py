"""The `hpd` command line: every subcommand registered, a broken one fails loudly, and the
packages under it never import `jobs` (dependencies point one way)."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import cli

ROOT = Path(__file__).resolve().parents[2]
# package -> top-level packages it may import (besides the standard library and third parties)
LAYERS = {
    "jobs": {"jobs", "evaluation", "bench", "training", "datafiles", "pipelines", "hpd_core"},
    "evaluation": {"evaluation", "datafiles", "pipelines", "hpd_core"},
    "bench": {"bench", "datafiles", "pipelines", "hpd_core"},
    "training": {"training", "datafiles", "pipelines", "hpd_core"},
    "datafiles": {"datafiles", "pipelines", "hpd_core"},
}
PROJECT = set().union(*LAYERS.values())


def test_every_subcommand_is_registered():
    _, modules = cli.build_parser()
    assert sorted(modules) == sorted(cli.SUBCOMMANDS)
    for module in modules.values():
        assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in cli.SUBCOMMANDS)])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: hpd {' '.join(argv[:-1])}".rstrip())


def test_extract_help_names_every_embedded_model():
    from hpd_core.models import EMBEDDED

    parser, _ = cli.build_parser()
    extract = next(a for a in parser._subparsers._group_actions[0].choices["extract"]._actions if "--model" in a.option_strings)
    assert all(f"'{name}'" in extract.help for name in EMBEDDED)


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_a_subcommand_that_fails_to_import_fails_the_cli(monkeypatch):
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", ("jobs.no_such_module", "a module that is not there"))
    with pytest.raises(ModuleNotFoundError, match="jobs.no_such_module"):
        cli.build_parser()


def _project_imports(path: Path) -> set[str]:
    """Top-level project packages that ``path`` imports (at module level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & PROJECT


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_dependencies_point_one_way(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files, f"no modules in {package}/"
    wrong = {str(f.relative_to(ROOT)): sorted(_project_imports(f) - LAYERS[package]) for f in files}
    assert {f: names for f, names in wrong.items() if names} == {}


@pytest.mark.parametrize("stop, code, said", [
    ("SIGTERM", 143, "hpd finetune: stopped (SIGTERM); the same command with --resume continues"),
    ("SIGINT", 130, "hpd finetune: interrupted; the same command with --resume continues"),
])
def test_a_stopped_command_says_how_to_continue_and_exits_by_its_signal(stop, code, said):
    """SIGTERM (a scheduler or pod stopping the job) unwinds like Ctrl-C: no traceback, the command's
    hint, exit 143 (Ctrl-C: 130). The command here stops itself with the signal."""
    code_text = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as a terminal would have it
        "from jobs import cli, finetune\n"
        f"finetune.run = lambda args: (os.kill(os.getpid(), signal.{stop}), time.sleep(30))\n"
        "sys.exit(cli.main(['finetune', '--train', 'unused', '--out', 'unused']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code_text], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


def test_the_sigterm_handler_from_before_is_back_after_a_command():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli.main(["evaluate", "--predictions", "/nonexistent",
                         "--gold", "/nonexistent", "--attributes", "/nonexistent"]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)

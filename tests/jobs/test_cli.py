"""The `hpd` command line: every subcommand registered, a broken one fails loudly, and the
packages under it never import `jobs` (dependencies point one way)."""

from __future__ import annotations

import ast
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

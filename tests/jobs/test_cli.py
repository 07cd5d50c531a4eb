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
    "pipelines": {"pipelines", "hpd_core"},
    "hpd_core": {"hpd_core"},
}
PROJECT = set().union(*LAYERS.values())
# the engine runs without Ray and without S3 (DESIGN.md): none of their libraries in hpd_core
NOT_IN_THE_ENGINE = {"ray", "boto3", "botocore", "s3fs", "fsspec"}


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


def test_the_cli_starts_without_the_model_libraries():
    """Every command's flags are built at start-up: a module that imports torch there made `hpd
    --help` (and every command's start, `hpd pick` and `hpd evaluate` included) take 3.8 s and
    385 MB here, against 0.2 s and 80 MB."""
    code = ("import sys\nfrom jobs import cli\ncli.build_parser()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


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
    return _imports(path) & PROJECT


def _imports(path: Path) -> set[str]:
    """Top-level packages that ``path`` imports (at module level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_dependencies_point_one_way(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files, f"no modules in {package}/"
    wrong = {str(f.relative_to(ROOT)): sorted(_project_imports(f) - LAYERS[package]) for f in files}
    assert {f: names for f, names in wrong.items() if names} == {}


def test_the_engine_imports_neither_ray_nor_s3():
    files = sorted((ROOT / "hpd_core").glob("*.py"))
    assert {str(f.relative_to(ROOT)): sorted(_imports(f) & NOT_IN_THE_ENGINE) for f in files
            if _imports(f) & NOT_IN_THE_ENGINE} == {}


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


# ------------------------------------------------------------------ S3 errors say what to check


@pytest.fixture
def s3_once(s3_server, monkeypatch):
    """The test S3 server's settings, each request tried once; boto3 clients built afresh, in a
    session of their own (a client keeps the credentials it was built with, boto3's default session
    those it found first)."""
    import boto3

    from pipelines import io

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # the one from before is back after the test
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    io._s3_client_with.cache_clear()
    yield s3_server
    io._s3_client_with.cache_clear()


def _s3_errors(bucket: str, tmp_path, capsys) -> tuple[str, str]:
    """What `hpd extract` says of an S3 --input it cannot read (pyarrow), and what a command that
    writes with boto3 says (a put that fails there)."""
    from pipelines import io
    from tests.pipelines.helpers import SAMPLE_ATTRIBUTES, extract_args

    assert cli.main(["extract", *extract_args(f"s3://{bucket}/records", tmp_path / "out",
                                              attributes=SAMPLE_ATTRIBUTES)]) == 2
    read = capsys.readouterr().err.strip()
    writer = type("Writer", (), {"run": staticmethod(lambda args: io.write_bytes(f"s3://{bucket}/x", b"x"))})
    assert cli._run("rejected", writer, None) == 2
    return read, capsys.readouterr().err.strip()


def test_s3_refusing_the_credentials_says_to_check_them(s3_once, monkeypatch, tmp_path, capsys):
    bucket = s3_once.make_bucket("creds")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    read, write = _s3_errors(bucket, tmp_path, capsys)
    hint = ("Check the S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the instance "
            f"role), and that they may use this bucket; requests go to AWS_ENDPOINT_URL={s3_once.endpoint}.")
    assert read.startswith("hpd extract: error: ") and "AWS Error ACCESS_DENIED" in read and read.endswith(hint), read
    assert write.startswith("hpd rejected: error: ClientError: ") and "(SignatureDoesNotMatch)" in write, write
    assert write.endswith(hint) and "Traceback" not in write


def test_an_s3_endpoint_that_does_not_answer_says_so(s3_once, monkeypatch, tmp_path, capsys):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    read, write = _s3_errors("cat", tmp_path, capsys)
    hint = f"S3 was not reached at AWS_ENDPOINT_URL={endpoint}: is the store running there, and is the URL right?"
    assert "AWS Error NETWORK_CONNECTION" in read and read.endswith(hint), read
    assert write.startswith("hpd rejected: error: EndpointConnectionError: ") and write.endswith(hint), write


def test_s3_hints_name_the_settings_as_they_are(monkeypatch):
    """The errors a new user met, word for word: without AWS_ENDPOINT_URL the requests went to AWS."""
    import botocore.exceptions

    from pipelines.io import s3_hint

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    unresolved = OSError("When getting information for key 'records' in bucket 'cat': AWS Error NETWORK_CONNECTION "
                         "during HeadObject operation: curlCode: 6, Could not resolve hostname; Details: Could not "
                         "resolve host: cat.s3.us-east-1.amazonaws.com")
    assert s3_hint(unresolved) == (
        "S3 was not reached at AWS (AWS_ENDPOINT_URL is unset): for an S3-compatible store (MinIO, SeaweedFS, ...) "
        "set AWS_ENDPOINT_URL to its URL; on AWS, check the network and AWS_REGION (us-east-1).")
    denied = OSError("When getting information for key 'records' in bucket 'cat': AWS Error ACCESS_DENIED during "
                     "HeadObject operation: No response body.")
    assert s3_hint(denied).endswith("requests go to AWS (AWS_ENDPOINT_URL is unset: set it for an S3-compatible store).")
    no_bucket = botocore.exceptions.ClientError({"Error": {"Code": "NoSuchBucket", "Message": "no"}}, "PutObject")
    assert s3_hint(no_bucket).startswith("No such bucket at AWS (")
    try:  # wrapped: the cause counts
        raise ValueError("--output s3://cat/out: cannot be written") from botocore.exceptions.NoCredentialsError()
    except ValueError as wrapped:
        assert s3_hint(wrapped).startswith("Check the S3 credentials")
    assert s3_hint(OSError("[Errno 2] No such file or directory")) is None
    slow = botocore.exceptions.ClientError({"Error": {"Code": "SlowDown", "Message": "slow"}}, "PutObject")
    assert s3_hint(slow) is None
    failing = type("Failing", (), {"run": staticmethod(lambda args: (_ for _ in ()).throw(slow))})
    with pytest.raises(botocore.exceptions.ClientError):  # not a setting: a traceback, as before
        cli._run("rejected", failing, None)

    def bug_while_handling(args):  # a bug in clean-up after an S3 error is no S3 error (helper-35)
        try:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        except botocore.exceptions.EndpointConnectionError:
            return {}["manifest"]

    with pytest.raises(KeyError):  # its traceback, not "S3 was not reached"
        cli._run("extract", type("Buggy", (), {"run": staticmethod(bug_while_handling)}), None)

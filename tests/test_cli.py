"""The ipybox command line: generate and stubs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from codegen_support import SERVERS, SUBPROCESS_TIMEOUT, http_server

import ipybox
from ipybox._cli import main
from ipybox._manifest import load_manifest

pytestmark = pytest.mark.anyio

SHAPES = str(SERVERS / "codegen_shapes.py")


def test_generate_from_a_command_prints_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tools"
    assert main(["generate", "shapes", "--root", str(root), "--", sys.executable, SHAPES]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {root / 'shapes'}/ from MCP server 'shapes': 13 tool modules (")
    assert "  a_b_2  (tool 'a-b')" in out and "  rate" in out
    assert "renamed: tool 'a-b' -> module 'a_b_2', because 'a_b' is taken by tool 'a_b'" in out
    assert out[-1] == f"server parameters recorded in {root / '.ipybox' / 'servers.json'} (host only)"
    assert load_manifest(root)["shapes"].model_dump()["args"] == (SHAPES,)

    assert main(["generate", "shapes", "--root", str(root), "--", sys.executable, SHAPES]) == 0
    assert capsys.readouterr().out.startswith(f"unchanged {root / 'shapes'}/")


def test_command_options_reach_the_server_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tools"
    argv = ["generate", "s", "--root", str(root), "--env", "A=1", "--env", "B=x=y", "--cwd", str(tmp_path)]
    assert main([*argv, "--", sys.executable, SHAPES]) == 0
    params = load_manifest(root)["s"].model_dump()
    assert params["env"] == {"A": "1", "B": "x=y"} and params["cwd"] == str(tmp_path)
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "x"], "give the server either as a command after '--'"),
        (["generate", "x", "--url", "http://127.0.0.1:9/mcp", "--", "cmd"], "give the server either"),
        (["generate", "x", "--url", "http://127.0.0.1:9/mcp", "--env", "A=1"], "--env and --cwd apply to"),
        (["generate", "x", "--header", "A=1", "--", "cmd"], "--header and --transport apply to --url"),
        (["generate", "x", "--url", "http://h/mcp", "--header", "novalue"], "--header takes NAME=VALUE"),
        (["generate", "x", "--url", "ftp://h/mcp"], "url: String should match pattern"),
    ],
)
def test_usage_mistakes_exit_2_with_the_fix_in_the_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_stubs_with_a_missing_root_names_the_root_option_not_the_api_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["stubs"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "ipybox: error: --root 'mcptools' is not a directory; pass the --root that 'ipybox generate' wrote to "
        "(default: mcptools, in the current directory)\n"
    )


def test_a_server_that_cannot_start_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "gone", "--root", str(tmp_path), "--", str(tmp_path / "missing")]) == 1
    assert (
        "ipybox: error: cannot generate sources for MCP server 'gone': cannot list its tools" in capsys.readouterr().err
    )


def test_stubs_prints_the_stubs_and_their_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tools"
    assert main(["generate", "shapes", "--root", str(root), "--", sys.executable, SHAPES]) == 0
    capsys.readouterr()
    assert main(["stubs", "--root", str(root), "--tool", "rate", "--tool", "get-weather"]) == 0
    captured = capsys.readouterr()
    assert "class rate:" in captured.out and "class get_weather:" in captured.out and "class echo:" not in captured.out
    assert captured.err == f"# {len(captured.out)} characters\n"


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_generate_from_a_url_with_python_dash_m(transport: str, tmp_path: Path) -> None:
    root = tmp_path / "tools"
    async with http_server(transport) as url:
        argv = [sys.executable, "-m", "ipybox", "generate", "remote", "--url", url, "--root", str(root)]
        if transport == "sse":
            argv += ["--transport", "sse"]
        with anyio.fail_after(SUBPROCESS_TIMEOUT):
            result = await anyio.run_process(argv, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().startswith(f"wrote {root / 'remote'}/ from MCP server 'remote': 13 tool modules")
    stored = load_manifest(root)["remote"].model_dump()
    assert stored["url"] == url and stored["type"] == ("sse" if transport == "sse" else "streamable-http")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"ipybox {ipybox.__version__}\n"


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["stubs", "--help"]])
def test_commands_that_need_no_mcp_connection_do_not_import_the_mcp_stack(argv: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ipybox", *argv], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    # -X importtime writes "import time: self | cumulative | module" for every module imported.
    imported = {line.rpartition("|")[2].strip().partition(".")[0] for line in run.stderr.splitlines()}
    assert imported & {"mcp", "mcp_types", "datamodel_code_generator", "jupyter_client", "zmq", "httpx2"} == set()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--transport", "http", "--host", "0.0.0.0"], "refusing to listen on '0.0.0.0' without a bearer token"),
        (["--transport", "http", "--no-token", "--allow-register"], "refusing --allow-register without a bearer"),
        (["--pool", "2"], "over stdio there is one session: drop --pool"),
        (["--allow", "network:github.com"], "list the destination in --allow-net"),
    ],
)
def test_ipybox_mcp_refuses_a_bad_command_line_before_importing_the_server_stack(argv: list[str], message: str) -> None:
    # The refusal costs no second of imports, and an MCP client starting the command shows it at once.
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ipybox", "mcp", "--no-sandbox", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and message in run.stderr, run.stderr
    imported = {line.rpartition("|")[2].strip().partition(".")[0] for line in run.stderr.splitlines()}
    assert imported & {"mcp", "mcp_types", "starlette", "uvicorn", "jupyter_client", "zmq"} == set()

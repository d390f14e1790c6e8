"""The ``ipybox`` command line: a dispatcher over subcommands.

``ipybox generate NAME -- COMMAND ARGS...`` and ``ipybox generate NAME --url URL [--transport sse]``
write the typed package of an MCP server; ``ipybox stubs`` prints the prompt stubs of generated
packages; ``ipybox auth import --url URL`` keeps OAuth tokens obtained elsewhere; ``ipybox mcp``
serves ipybox over MCP; ``ipybox kernel-host --port P --token-file F`` keeps sandboxed kernels in a
long-lived local host for durable approvals. Each subcommand is a ``_cmd_*`` function registered in `_build_parser`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio

from . import __version__
from ._exceptions import IpyboxError, UsageError
from ._manifest import MANIFEST_DIR, MANIFEST_FILE
from .codegen._stubs import render_tool_stubs
from .mcp_server._command import run_parsed as run_mcp_server
from .mcp_server._options import add_arguments as add_mcp_arguments

if TYPE_CHECKING:
    from ._mcp._oauth import OAuth
    from .codegen._codegen import GenerationReport

__all__ = ("main",)

DEFAULT_ROOT = "mcptools"

_Command = Callable[[argparse.Namespace], int]


def _pairs(values: Sequence[str] | None, option: str) -> dict[str, str] | None:
    if not values:
        return None
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes NAME=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def _server_params(args: argparse.Namespace) -> dict[str, Any]:
    command: list[str] = args.command
    if bool(args.url) == bool(command):
        raise UsageError(
            "give the server either as a command after '--' (ipybox generate NAME -- npx -y some-server) "
            "or with --url URL"
        )
    oauth_options = [args.scope, args.client_id, args.client_secret, args.redirect_uri, args.client_credentials]
    if args.url:
        if args.env or args.cwd:
            raise UsageError("--env and --cwd apply to servers started with a command, not to --url")
        params: dict[str, Any] = {"url": args.url, "type": args.transport, "headers": _pairs(args.header, "--header")}
        if args.oauth or any(oauth_options):
            oauth = {
                "grant": "client_credentials" if args.client_credentials else "authorization_code",
                "scope": args.scope,
                "client_id": args.client_id,
                "client_secret": args.client_secret,
            }
            if args.redirect_uri:
                oauth["redirect_uri"] = args.redirect_uri
            params["oauth"] = {key: value for key, value in oauth.items() if value is not None}
        return params
    if args.header or args.transport != "streamable-http":
        raise UsageError("--header and --transport apply to --url servers, not to a command")
    if args.oauth or any(oauth_options):
        raise UsageError("--oauth and the other OAuth options apply to --url servers, not to a command")
    return {"command": command[0], "args": command[1:], "env": _pairs(args.env, "--env"), "cwd": args.cwd}


def _print_report(report: GenerationReport, root: Path) -> None:
    sources = report.sources
    where = f"{report.path}/"
    took = report.timings["total"] - report.timings["connect"]
    status = "wrote" if report.changed else "unchanged"
    print(
        f"{status} {where} from MCP server {report.server_name!r}: {len(sources.tools)} tool modules "
        f"({took:.2f} s after connecting)"
    )
    for tool in sources.tools:
        origin = "" if tool.name == tool.module else f"  (tool {tool.name!r})"
        print(f"  {tool.module}{origin}")
    for renamed in sources.renamed:
        print(
            f"renamed: tool {renamed.original!r} -> module {renamed.identifier!r}, "
            f"because {renamed.wanted!r} is taken by tool {renamed.taken_by!r}"
        )
    for tool in sources.tools:
        if tool.fallbacks:
            print(f"permissive {' and '.join(tool.fallbacks)} for tool {tool.name!r}: {'; '.join(tool.notes)}")
    print(f"server parameters recorded in {root / MANIFEST_DIR / MANIFEST_FILE} (host only)")


def _cmd_generate(args: argparse.Namespace) -> int:
    # Imported here, like the MCP server below: code generation needs the MCP client and
    # datamodel-code-generator, which `ipybox --version`, `--help` and `stubs` should not load.
    from ._mcp._loopback import LoopbackAuthorizer
    from ._mcp._oauth import OAuth

    params = _server_params(args)
    root = Path(args.root)
    # A person at this terminal authorizes in the host's browser; tokens go to the default store.
    oauth = OAuth(authorize=LoopbackAuthorizer())
    report = _generate(args.name, params, root, oauth)
    _print_report(report, root)
    return 0


def _generate(name: str, params: dict[str, Any], root: Path, oauth: OAuth) -> GenerationReport:
    from .codegen._codegen import generate_package

    async def run() -> GenerationReport:
        return await generate_package(name, params, root, oauth=oauth)

    return anyio.run(run)


def _cmd_stubs(args: argparse.Namespace) -> int:
    # Checked here, not left to render_tool_stubs: its error names its own argument, root_dir.
    if not Path(args.root).is_dir():
        raise UsageError(
            f"--root {args.root!r} is not a directory; pass the --root that 'ipybox generate' wrote to "
            f"(default: {DEFAULT_ROOT}, in the current directory)"
        )
    text = render_tool_stubs(args.root, servers=args.server or None, tools=args.tool or None)
    sys.stdout.write(text)
    print(f"# {len(text)} characters", file=sys.stderr)
    return 0


def _cmd_auth_import(args: argparse.Namespace) -> int:
    import json

    from ._mcp._tokenimport import import_tokens

    # Read from stdin, never from arguments: a command line is visible to every local user.
    text = sys.stdin.read()
    try:
        tokens: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"the tokens on stdin are not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(tokens, dict):
        raise UsageError("the tokens on stdin must be a JSON object (a token response with client_id added)")

    fields = cast(dict[str, Any], tokens)

    async def run() -> str:
        return await import_tokens(args.url, fields)

    endpoint = anyio.run(run)
    print(f"kept the tokens for {args.url}; they are refreshed at {endpoint}")
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    return run_mcp_server(args)


def _cmd_kernel_host(args: argparse.Namespace) -> int:
    # Imported here: only this subcommand runs a gateway.
    from ._gateway._kernelhost import run_kernel_host

    return run_kernel_host(args.port, Path(args.token_file))


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ipybox", description="Sandboxed Python code actions with MCP tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    generate = commands.add_parser(
        "generate",
        usage="ipybox generate NAME [options] (-- COMMAND [ARGS...] | --url URL)",
        help="generate the typed Python package of an MCP server",
        description="Connect to an MCP server and write a typed Python module per tool under --root.",
        epilog="examples:\n  ipybox generate fetch -- uvx mcp-server-fetch\n"
        "  ipybox generate search --url http://127.0.0.1:8000/mcp --header 'Authorization=Bearer ${TOKEN}'\n"
        "  ipybox generate linear --url https://mcp.linear.app/mcp --oauth",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_argument("name", help="the name to register the server under (the package name is derived)")
    generate.add_argument("--url", help="the URL of a running streamable HTTP or SSE server")
    generate.add_argument(
        "--transport", choices=["streamable-http", "sse"], default="streamable-http", help="for --url"
    )
    generate.add_argument("--header", action="append", metavar="NAME=VALUE", help="HTTP header for --url")
    generate.add_argument(
        "--oauth",
        action="store_true",
        help="for --url: authorize with OAuth 2.1 in the browser (tokens stay on the host)",
    )
    generate.add_argument("--scope", help="OAuth scopes to ask for (default: what the server names)")
    generate.add_argument("--client-id", help="a pre-registered OAuth client (default: the client registers itself)")
    generate.add_argument(
        "--client-secret", help="its secret; write it as '${VAR}' so the manifest keeps only the name"
    )
    generate.add_argument("--redirect-uri", help="where the browser returns (default http://127.0.0.1:47651/callback)")
    generate.add_argument(
        "--client-credentials", action="store_true", help="OAuth client credentials (no browser; needs --client-id)"
    )
    generate.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment for a command")
    generate.add_argument("--cwd", help="working directory for a command")
    generate.add_argument("--root", default=DEFAULT_ROOT, help=f"the tools directory (default: {DEFAULT_ROOT})")
    generate.set_defaults(handler=_cmd_generate)

    stubs = commands.add_parser(
        "stubs",
        help="print compact Python stubs of generated packages (for prompts)",
        description="Print the stubs of generated tool packages; the character count goes to stderr.",
    )
    stubs.add_argument("--root", default=DEFAULT_ROOT, help=f"the tools directory (default: {DEFAULT_ROOT})")
    stubs.add_argument("--server", action="append", help="only this server (repeatable)")
    stubs.add_argument("--tool", action="append", help="only this tool (repeatable)")
    stubs.set_defaults(handler=_cmd_stubs)

    auth = commands.add_parser("auth", help="OAuth tokens of remote MCP servers")
    auth_commands = auth.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    imported = auth_commands.add_parser(
        "import",
        help="keep tokens obtained elsewhere (JSON on stdin)",
        description="Keep OAuth tokens obtained elsewhere for an MCP server, read as a JSON object from stdin: "
        "client_id, refresh_token and/or access_token, and optionally client_secret, "
        "token_endpoint_auth_method, expires_in, scope. The token endpoint is discovered from the server.",
        epilog="example:\n  ipybox auth import --url https://mcp.example.com/mcp < tokens.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    imported.add_argument("--url", required=True, help="the MCP server's URL, as given to 'ipybox generate'")
    imported.set_defaults(handler=_cmd_auth_import)

    mcp = commands.add_parser(
        "mcp", help="serve ipybox over MCP (stdio or streamable HTTP) for MCP clients such as Claude Code"
    )
    add_mcp_arguments(mcp)
    mcp.set_defaults(handler=_cmd_mcp)

    host = commands.add_parser(
        "kernel-host",
        help="keep sandboxed kernels in a long-lived local host (127.0.0.1, with a token), so that code "
        "actions suspended at an approval can be resumed by any process on this machine",
    )
    host.add_argument("--port", type=int, required=True, help="the port on 127.0.0.1 to listen on")
    host.add_argument(
        "--token-file",
        required=True,
        help="where to write the host's token (mode 0600; replaced if it exists, removed when the host stops)",
    )
    host.set_defaults(handler=_cmd_kernel_host)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ipybox`` command line; returns the exit status.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.
    """
    parser = _build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the server's command line, passed on untouched (argparse
    # would otherwise bind it to positionals before the options that come first).
    command: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, command = arguments[:split], arguments[split + 1 :]
    args, unknown = parser.parse_known_args(arguments)
    if unknown and args.subcommand == "generate" and not command and not unknown[0].startswith("-"):
        # The usual slip: the server's command without the '--' before it.
        known = list(arguments)
        for word in unknown:
            known.remove(word)
        suggested = shlex.join(["ipybox", *known, "--", *unknown])
        parser.error(
            f"unrecognized arguments: {shlex.join(unknown)}; put the server's command after '--', e.g. {suggested}"
        )
    if unknown:
        parser.error(f"unrecognized arguments: {shlex.join(unknown)}")
    if command and args.subcommand != "generate":
        parser.error(f"'--' is only used by 'ipybox generate', not by {args.subcommand!r}")
    args.command = command
    handler: _Command = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        print(f"ipybox: error: {exc}", file=sys.stderr)
        return 2
    except IpyboxError as exc:
        print(f"ipybox: error: {exc}", file=sys.stderr)
        return 1

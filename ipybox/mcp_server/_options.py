"""Configuration of ipybox's MCP server: the options, the config file, and the command line.

Kept apart from `ipybox.mcp_server` so that ``ipybox --help`` does not import the MCP server stack.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from ipybox._approval._decisions import ApprovalRules, check_tool_pattern
from ipybox._exceptions import SandboxUnavailable, UsageError
from ipybox._mcp._servers import HttpServer, StdioServer, parse_server_params
from ipybox._settings import KernelSettings, Limits, SandboxConfig, Timeouts
from ipybox.network._policy import Network
from ipybox.network._setup import check_network
from ipybox.sandbox._sandbox import resolve_sandbox

__all__ = (
    "DEFAULT_TIMEOUTS",
    "TOKEN_ENV",
    "ApprovalMode",
    "ServerConfig",
    "add_arguments",
    "bearer_token",
    "check_exposure",
    "config_from_args",
    "is_loopback",
)

ApprovalMode = Literal["ask", "auto", "deny"]

# Environment variable holding the bearer token, so it does not show in the process list.
TOKEN_ENV = "IPYBOX_MCP_TOKEN"
DEFAULT_PORT = 8000
# Seconds a session may go without a request before its kernel is shut down (restarted on the next).
DEFAULT_IDLE_TTL = 30 * 60.0


# The MCP server's own timeouts where an SDK executor has none: a model's cell should not run for
# ever, and an elicitation nobody answers should not hold the kernel.
DEFAULT_TIMEOUTS = Timeouts(execution=120.0, approval=300.0)
DEFAULT_MAX_OUTPUT_CHARS = 20_000
DEFAULT_MAX_FILE_BYTES = 20 * 1024**2


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Everything the MCP server needs to know; one `CodeExecutor` per MCP session is built from it.

    What the kernels are started with is the executor's own `KernelSettings`, with its defaults;
    the timeouts are the executor's `Timeouts` (only their defaults differ: see `DEFAULT_TIMEOUTS`).

    Attributes:
        kernel: What every session's kernel is started with. Its ``workspace``: with several sessions
            (HTTP), each session works in its own subdirectory ``sessions/<id>`` of it, with its own
            tools directory (``tools_dir`` is not used); its ``skills_dir``: where skills are saved
            (the ``save_skill`` and ``list_skills`` tools, and ``ipybox_kernel.save_skill`` in
            kernel code), shared by every session, so a skill one session saves is importable in
            the next; its ``network`` follows ``network`` below.
        timeouts: ``execution`` is the default time one ``execute_ipython_cell`` may run,
            ``approval`` how long to wait for the user's answer before rejecting a tool call.
        max_timeout: The largest timeout a client may ask for.
        max_output_chars: Default characters of output returned by one cell.
        max_code_chars: The longest code string accepted.
        max_file_bytes: The largest file ``upload_file``/``download_file`` move.
        approval: The `ApprovalRules` of every session's tool calls and asked connections, built
            once from the command line and the config file (``--allow``, ``--deny``, ``--deny-net``,
            ``--allow-read-only``, ``--approval``). What they leave open (``otherwise="ask"``) goes to
            the client's user through MCP elicitation (rejected with a hint when the client cannot be
            asked). ``"ask"``, ``"auto"`` and ``"deny"`` are shorthands for rules with only
            ``otherwise`` (``"ask"``, ``"accept"``, ``"reject"``). With ``allow_read_only``, mind
            that a server is started only for an approved call, so its annotations are known from
            the second call on: the first call to a server is decided by the other rules.
        servers: MCP servers registered in every session at its start.
        allow_register: Whether clients may register servers (which runs commands on the host).
        idle_ttl: Seconds without a request after which a session's kernel is shut down; the next
            request starts a fresh one (variables are lost; registered servers and files are kept).
            Over HTTP, a session whose client has gone away is closed after this time.
        network: Network egress for the kernels (`Network`); None: no network. Unlisted
            destinations asked (``unlisted="ask"``) are rejected if ``deny_net`` lists them, else
            decided by the mode; tool globs in ``allow``/``deny`` never match them.
        pool_size: Over HTTP, kernels kept started for new sessions (0: none), so that a new
            session's first cell does not wait for its kernel to start. Each pooled kernel comes with
            its own directory ``sessions/<random>`` and tools directory, the shared ``skills_dir``
            mounted, and with ``network`` the forwarder to its session's proxy.
    """

    kernel: KernelSettings
    timeouts: Timeouts = DEFAULT_TIMEOUTS
    max_timeout: float = 3600.0
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_code_chars: int = 1_000_000
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    approval: ApprovalRules | ApprovalMode = field(default_factory=ApprovalRules)
    servers: Mapping[str, StdioServer | HttpServer] = field(default_factory=dict[str, StdioServer | HttpServer])
    allow_register: bool = True
    idle_ttl: float = DEFAULT_IDLE_TTL
    network: Network | None = None
    pool_size: int = 0

    def __post_init__(self) -> None:
        kernel = cast("object", self.kernel)
        if not isinstance(kernel, KernelSettings):
            raise UsageError(f"kernel must be a KernelSettings, got {kernel!r}")
        check_network(self.network, None if self.kernel.sandbox is None else SandboxConfig())
        # The kernels are started for the network the sessions' executors have (frozen: object.__setattr__).
        object.__setattr__(self, "kernel", replace(self.kernel, network=self.network is not None))
        if isinstance(self.approval, str):
            if self.approval not in _OTHERWISE:
                raise UsageError(f"approval must be ApprovalRules, 'ask', 'auto' or 'deny', got {self.approval!r}")
            object.__setattr__(self, "approval", ApprovalRules(otherwise=_OTHERWISE[self.approval]))
        elif not isinstance(self.approval, ApprovalRules):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"approval must be ApprovalRules, 'ask', 'auto' or 'deny', got {self.approval!r}")
        for name, value in (("max_timeout", self.max_timeout), ("idle_ttl", self.idle_ttl)):
            if not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds, got {value!r}")
        for name, size in (
            ("max_output_chars", self.max_output_chars),
            ("max_code_chars", self.max_code_chars),
            ("max_file_bytes", self.max_file_bytes),
        ):
            if size < 1:
                raise UsageError(f"{name} must be at least 1, got {size!r}")
        if self.pool_size < 0:
            raise UsageError(f"pool_size must be a number of kernels (0 for no pool), got {self.pool_size!r}")

    @property
    def rules(self) -> ApprovalRules:
        """The approval rules of every session (`approval`, never a shorthand once built)."""
        assert isinstance(self.approval, ApprovalRules)
        return self.approval


_OTHERWISE: dict[str, Literal["ask", "accept", "reject"]] = {"ask": "ask", "auto": "accept", "deny": "reject"}


def _load_config_file(path: Path) -> dict[str, Any]:
    try:
        data: object = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"config file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {str(path)!r} must hold a JSON object")
    return cast("dict[str, Any]", data)


# The keys a config file may hold, at the top and in "approval"; anything else is a mistake to report.
_CONFIG_KEYS = ("mcpServers", "approval")
_APPROVAL_KEYS = ("mode", "allow", "deny", "allowReadOnly")


def _check_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """Refuse keys that would otherwise be ignored without a word (``mcpServer``, ``aproval``)."""
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(map(repr, known))}"
            raise UsageError(f"unknown key {key!r} in {where}; {hint}")


def _servers_from(data: Mapping[str, Any], source: str) -> dict[str, StdioServer | HttpServer]:
    raw: object = data.get("mcpServers", {})
    if not isinstance(raw, dict):
        raise UsageError(f"'mcpServers' in {source} must be an object mapping names to server parameters")
    servers: dict[str, StdioServer | HttpServer] = {}
    for name, params in cast("dict[str, object]", raw).items():
        if not isinstance(params, dict):
            raise UsageError(f"server {name!r} in {source} must be an object")
        try:
            servers[name] = parse_server_params(cast("dict[str, Any]", params))
        except UsageError as exc:
            raise UsageError(f"server {name!r} in {source}: {exc}") from None
    return servers


def _str_list(value: object, key: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in cast("list[object]", value)):
        raise UsageError(f"{key!r} in {source} must be a list of strings")
    return tuple(cast("list[str]", value))


def _pairs(values: Sequence[str] | None) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values or ():
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes NAME=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the MCP server's options to ``parser`` (shared by ``ipybox mcp`` and ``python -m ipybox.mcp_server``)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Serve ipybox over MCP: a sandboxed, stateful IPython kernel per MCP session that runs code\n"
        "actions and calls the tools of other MCP servers through generated Python modules.\n"
        "Tool calls made by kernel code are approved by the client's user (MCP elicitation) or by\n"
        "the policy given here."
    )
    parser.epilog = (
        "config file (JSON, --config):\n"
        '  {"mcpServers": {"fetch": {"command": "uvx", "args": ["mcp-server-fetch"]}},\n'
        '   "approval": {"mode": "ask", "allow": ["fetch.*"], "deny": [], "allowReadOnly": false}}\n'
        "  Command-line options override the file; --allow/--deny patterns are added to its lists.\n\n"
        "examples:\n"
        "  ipybox mcp --workspace ~/work --config servers.json\n"
        "  ipybox mcp --transport http --port 8765   # prints where its token is\n"
        f"  {TOKEN_ENV}=secret ipybox mcp --transport http --port 8765\n"
        "  ipybox mcp --approval deny --allow 'github.search_*' --allow-read-only"
    )
    where = parser.add_argument_group("transport")
    where.add_argument(
        "--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or streamable HTTP"
    )
    where.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on (default: 127.0.0.1)")
    where.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"HTTP: port, 0 picks a free one (default: {DEFAULT_PORT})"
    )
    where.add_argument(
        "--bearer-token",
        help=f"HTTP: require 'Authorization: Bearer TOKEN' (prefer the {TOKEN_ENV} environment variable); "
        "without one the server makes up a token and writes it to a file only you can read",
    )
    where.add_argument(
        "--no-token",
        action="store_true",
        help="HTTP on a loopback address: serve without a token, so that every local process and user may run "
        "code here (not with --allow-register)",
    )
    where.add_argument(
        "--idle-ttl",
        type=float,
        default=DEFAULT_IDLE_TTL,
        metavar="SECONDS",
        help="shut a session's kernel down after this many seconds without requests; the next request "
        f"starts a fresh one, keeping registered servers and files (default: {DEFAULT_IDLE_TTL:g})",
    )
    where.add_argument(
        "--pool",
        type=int,
        default=0,
        metavar="N",
        help="HTTP: keep N sandboxed kernels started, so that a new session is ready at once (default: 0)",
    )

    kernel = parser.add_argument_group("kernel")
    kernel.add_argument("--config", type=Path, metavar="FILE", help="JSON config file (see below)")
    kernel.add_argument("--workspace", type=Path, default=Path("."), help="the kernel's working directory (default: .)")
    kernel.add_argument("--no-sandbox", action="store_true", help="run the kernel without bubblewrap (unsafe)")
    kernel.add_argument("--ro-path", action="append", type=Path, default=[], help="extra path the kernel may read")
    kernel.add_argument("--rw-path", action="append", type=Path, default=[], help="extra path the kernel may write")
    kernel.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment variable for the kernel")
    memory = Limits().memory
    kernel.add_argument(
        "--memory-mb",
        type=int,
        help=f"kernel memory limit in MiB (default: {memory // 1024**2 if memory else 'none'}; 0: none)",
    )
    kernel.add_argument(
        "--timeout", type=float, help=f"default cell timeout in seconds (default: {DEFAULT_TIMEOUTS.execution:g})"
    )
    kernel.add_argument(
        "--max-output-chars",
        type=int,
        help=f"default output characters per cell (default: {DEFAULT_MAX_OUTPUT_CHARS})",
    )
    kernel.add_argument(
        "--max-file-mb",
        type=float,
        help=f"largest upload/download in MiB (default: {DEFAULT_MAX_FILE_BYTES // 1024**2})",
    )
    kernel.add_argument(
        "--skills-dir",
        type=Path,
        metavar="DIR",
        help="save skills (code that worked, as importable modules) here and offer the save_skill and "
        "list_skills tools; shared by all sessions (default: no skills)",
    )
    kernel.add_argument(
        "--no-register", action="store_true", help="clients may not register MCP servers (only --config ones)"
    )
    kernel.add_argument(
        "--allow-register",
        action="store_true",
        help="over HTTP, let clients register MCP servers; this lets anyone with the token run commands on "
        "this host (always allowed over stdio, where the client is the local user)",
    )

    approval = parser.add_argument_group("approval of tool calls made by kernel code")
    approval.add_argument(
        "--approval",
        choices=["ask", "auto", "deny"],
        help="calls no rule decides: ask the client's user via elicitation (default; rejected when the "
        "client cannot be asked), approve all, or reject all",
    )
    approval.add_argument(
        "--allow", action="append", default=[], metavar="GLOB", help="approve server.tool globs (tool calls only)"
    )
    approval.add_argument(
        "--deny", action="append", default=[], metavar="GLOB", help="reject server.tool globs (tool calls only)"
    )
    approval.add_argument(
        "--allow-read-only",
        action="store_true",
        help="approve tools annotated readOnlyHint (trusted servers only); a server is started for an approved "
        "call only, so the first call to a server is decided by the other rules",
    )

    network = parser.add_argument_group("network egress of kernel code (none by default)")
    network.add_argument(
        "--allow-net",
        action="append",
        default=[],
        metavar="DEST",
        help="let kernel code connect to DEST through the host's proxy: a host name, '*.domain', an address or "
        "network, optionally ':PORT' or ':*' (default ports 80 and 443); repeatable",
    )
    network.add_argument(
        "--ask-net",
        action="store_true",
        help="decide destinations not in --allow-net by --deny-net, then --approval (ask the user, approve, "
        "reject) instead of denying them; --allow/--deny tool globs never match destinations",
    )
    network.add_argument(
        "--deny-net",
        action="append",
        default=[],
        metavar="DEST",
        help="with --ask-net: reject DEST without asking (written as for --allow-net); repeatable",
    )


def _working_sandbox(sandbox: SandboxConfig) -> SandboxConfig:
    """Check the sandbox works here before the server starts: an MCP client shows a server that
    started as connected, and a missing bwrap would surface only in the first cell's error."""
    try:
        resolve_sandbox(sandbox)
    except SandboxUnavailable as exc:
        # Its advice names the Python API's opt-out; on the command line that is --no-sandbox.
        raise UsageError(str(exc).replace("sandbox=None", "--no-sandbox")) from None
    return sandbox


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build the configuration from parsed arguments and the ``--config`` file they name.

    Raises:
        UsageError: An option or the config file is invalid.
    """
    data: dict[str, Any] = {}
    source = "the command line"
    if args.config is not None:
        data = _load_config_file(args.config)
        source = f"config file {str(args.config)!r}"
        _check_keys(data, _CONFIG_KEYS, source)
    servers = _servers_from(data, source)
    policy_raw: object = data.get("approval", {})
    if not isinstance(policy_raw, dict):
        raise UsageError(f"'approval' in {source} must be an object")
    policy = cast("dict[str, object]", policy_raw)
    _check_keys(policy, _APPROVAL_KEYS, f"'approval' of {source}")
    allow = (*_str_list(policy.get("allow"), "allow", source), *args.allow)
    deny = (*_str_list(policy.get("deny"), "deny", source), *args.deny)
    # Checked here to name the options: a destination goes to --allow-net, never to --allow.
    for pattern in allow:
        check_tool_pattern(pattern, "--allow", "--allow-net")
    for pattern in deny:
        check_tool_pattern(pattern, "--deny", "--deny-net (with --ask-net)")
    mode: object = args.approval or policy.get("mode", "ask")
    if mode not in _OTHERWISE:
        raise UsageError(f"approval mode in {source} must be 'ask', 'auto' or 'deny', got {mode!r}")
    # The one rules object of every session, built here once.
    rules = ApprovalRules(
        allow=allow,
        deny=deny,
        deny_net=args.deny_net,
        allow_read_only=args.allow_read_only or policy.get("allowReadOnly") is True,
        otherwise=_OTHERWISE[cast("str", mode)],
    )
    limits = Limits()
    if args.memory_mb is not None:
        limits = Limits(memory=args.memory_mb * 1024**2 if args.memory_mb > 0 else None)
    timeouts = DEFAULT_TIMEOUTS
    if args.timeout is not None:
        timeouts = replace(timeouts, execution=args.timeout)
    extra: dict[str, Any] = {}
    if args.max_output_chars is not None:
        extra["max_output_chars"] = args.max_output_chars
    if args.max_file_mb is not None:
        extra["max_file_bytes"] = int(args.max_file_mb * 1024**2)
    if args.pool and args.transport != "http":
        raise UsageError("--pool keeps kernels for new HTTP sessions; over stdio there is one session: drop --pool")
    ro_paths = tuple(p.expanduser().resolve() for p in args.ro_path)
    rw_paths = tuple(p.expanduser().resolve() for p in args.rw_path)
    sandbox = None if args.no_sandbox else _working_sandbox(SandboxConfig(ro_paths=ro_paths, rw_paths=rw_paths))
    return ServerConfig(
        kernel=KernelSettings(
            workspace=args.workspace.expanduser().resolve(),
            sandbox=sandbox,
            env=_pairs(args.env),
            limits=limits,
            skills_dir=args.skills_dir.expanduser().resolve() if args.skills_dir is not None else None,
        ),
        timeouts=timeouts,
        approval=rules,
        servers=servers,
        # Registering a server starts a command on this host: a local stdio client may, a network
        # client only when the operator says so.
        allow_register=not args.no_register and (args.transport == "stdio" or args.allow_register),
        idle_ttl=args.idle_ttl,
        network=Network(allow=args.allow_net, unlisted="ask" if args.ask_net else "deny")
        if args.allow_net or args.ask_net
        else None,
        pool_size=args.pool,
        **extra,
    )


def bearer_token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--bearer-token`` or the environment (empty means none)."""
    token: str | None = args.bearer_token or os.environ.get(TOKEN_ENV)
    return token or None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is only reachable from this machine."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"  # another name may resolve to any address


def check_exposure(host: str, token: str | None, *, allow_register: bool = False) -> None:
    """Refuse to serve HTTP without a bearer token beyond this machine, or with registration.

    Whoever reaches the server runs code in its kernels (and, with ``--allow-register``, commands
    on this host), so only a loopback address may go without a token (``--no-token``), and then
    without registration: every local process, of every user, could otherwise run a host command.

    Raises:
        UsageError: There is no token and ``host`` is not a loopback address or clients may register
            servers.
    """
    if token is not None:
        return
    if not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host!r} without a bearer token: anyone who reaches it could run code "
            f"here; set {TOKEN_ENV} (or pass --bearer-token), or listen on 127.0.0.1"
        )
    if allow_register:
        raise UsageError(
            "refusing --allow-register without a bearer token: any local process could register a server, "
            "that is run a command on this host; drop --no-token (a token is made up and written to a file "
            f"only you can read), or set {TOKEN_ENV}"
        )

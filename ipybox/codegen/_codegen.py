"""Typed Python packages generated from the tools of an MCP server.

`generate_mcp_sources` connects to a server, lists its tools and writes ``<root_dir>/<server>/``:
an ``__init__.py`` that lists the tools, and one module per tool with pydantic ``Params`` (from the
tool's input schema), ``Result`` (from its output schema, when it has one), ``run(params)`` and
``async arun(params)``. Kernel code imports these modules; ``run`` sends the call through
``ipybox_kernel`` to the host, which looks the server up by name in the manifest
(`ipybox._manifest`). No command line, URL, header or environment value is written into the package.

What ``run`` sends: ``params.model_dump(mode="json", by_alias=True, exclude_unset=True)``, i.e. only
the fields the caller set, under their schema names. Defaults are left to the server (which owns
them), and a field the caller explicitly sets to None is sent as ``null`` rather than dropped, so
"clear this value" stays expressible. Plain dicts are validated into ``Params`` first.

Output is deterministic: the same server (same tools, same ipybox) gives the same bytes, and
regenerating an unchanged server leaves the files untouched. A new package is written next to the
old one and swapped in only when complete, so a failed generation leaves the previous one intact.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread
import httpx2
import mcp_types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared.exceptions import MCPError

from ipybox._exceptions import GenerationError, MCPServerError, UsageError
from ipybox._manifest import load_manifest, manifest_lock, save_manifest_entry
from ipybox._mcp._oauth import OAuth
from ipybox._mcp._serverasks import ClientFeatures, session_callbacks
from ipybox._mcp._servers import (
    HttpServer,
    ServerExitWatch,
    StdioServer,
    http_refusals,
    open_session,
    parse_server_params,
)
from ipybox._tooldir import check_tools_dir, prepare_tools_dir, tools_dir_path
from ipybox_kernel._records import INDEX_FILE

from ._modelgen import warm_up
from ._names import python_identifier
from ._sources import MAX_TOOLS, PackageSources, build_package_sources

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = ("GenerationReport", "generate_mcp_sources", "generate_package")

# Listing tools is one or a few round trips; a server that takes longer is stuck.
LIST_TOOLS_TIMEOUT = 30.0
# A bound that keeps a hostile server from making generation run (or write) without end (see MAX_TOOLS).
MAX_TOOL_PAGES = 100
# Resources and prompts listed in a package's docstring; the rest are counted, not listed.
MAX_LISTED = 100

_CONNECTION_ERRORS = (
    MCPServerError,
    MCPError,
    OSError,
    TimeoutError,
    httpx2.HTTPError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


@dataclass(frozen=True)
class GenerationReport:
    """What `generate_package` did.

    Attributes:
        server_name: The server's name, as given.
        path: The package directory.
        sources: The package's files and per-tool reports.
        changed: False when the package on disk was already identical and was left untouched.
        timings: Seconds spent connecting, listing tools, generating sources, writing files, and
            disconnecting (stopping a stdio server; this overlaps with generating), and in total.
            ``total - connect`` is the time from the finished handshake to the package on disk.
    """

    server_name: str
    path: Path
    sources: PackageSources
    changed: bool
    timings: Mapping[str, float] = field(default_factory=dict[str, float])

    @property
    def modules(self) -> tuple[str, ...]:
        """The tool module names written, sorted."""
        return self.sources.modules


@dataclass(frozen=True)
class _Listing:
    tools: list[mcp_types.Tool]
    server_info: mcp_types.Implementation | None
    instructions: str | None
    resources: list[mcp_types.Resource]
    prompts: list[mcp_types.Prompt]


async def _list_others(session: ClientSession) -> tuple[list[mcp_types.Resource], list[mcp_types.Prompt]]:
    """The first page of the server's resources and prompts, for the package's docstring; none
    when the server does not offer them (or fails to list them: they are only listed)."""
    capabilities = session.server_capabilities
    resources: list[mcp_types.Resource] = []
    prompts: list[mcp_types.Prompt] = []
    with anyio.move_on_after(LIST_TOOLS_TIMEOUT):
        if capabilities is not None and capabilities.resources is not None:
            with contextlib.suppress(MCPError):
                resources = (await session.list_resources()).resources[:MAX_LISTED]
        if capabilities is not None and capabilities.prompts is not None:
            with contextlib.suppress(MCPError):
                prompts = (await session.list_prompts()).prompts[:MAX_LISTED]
    return resources, prompts


async def _list_tools(
    server_name: str,
    watch: ServerExitWatch,
    timings: dict[str, float],
    send: MemoryObjectSendStream[_Listing],
    client: _Client,
) -> None:
    """Send the server's tool listing as soon as it is in, then close the session."""
    start = time.perf_counter()
    # The same capabilities as the tool server's sessions (a server may list tools by them), with
    # nobody's code action to decide a question by: asked during generation, it is declined.
    callbacks = session_callbacks(client.features, elicit=_decline_elicitation, sample=_decline_sampling)
    async with (
        send,
        open_session(
            server_name, watch.params, errlog=watch.errlog, oauth=client.oauth, callbacks=callbacks
        ) as session,
    ):
        timings["connect"] = time.perf_counter() - start
        start = time.perf_counter()
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        refusals = http_refusals(session)
        with anyio.fail_after(LIST_TOOLS_TIMEOUT):
            for _ in range(MAX_TOOL_PAGES):
                request = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
                mark = refusals.mark() if refusals is not None else (0, 0)
                try:
                    page = await session.list_tools(params=request)
                except MCPError as exc:
                    why = refusals.explain(mark) if refusals is not None else None
                    if why is None:
                        raise
                    raise MCPServerError(server_name, why) from exc
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor or len(tools) > MAX_TOOLS:
                    break
            else:
                raise GenerationError(server_name, f"the tool listing has more than {MAX_TOOL_PAGES} pages")
        timings["list_tools"] = time.perf_counter() - start
        resources, prompts = await _list_others(session)
        await send.send(_Listing(tools, session.server_info, session.instructions, resources, prompts))
        start = time.perf_counter()
    # Stopping a stdio server takes a while; generation runs meanwhile.
    timings["disconnect"] = time.perf_counter() - start


def _same_files(directory: Path, files: Mapping[str, str]) -> bool:
    if not directory.is_dir():
        return False
    present = {p.name for p in directory.iterdir() if p.is_file() and (p.suffix == ".py" or p.name == INDEX_FILE)}
    if present != set(files):
        return False
    return all((directory / name).read_bytes() == text.encode("utf-8") for name, text in files.items())


def _install(given: Path, sources: PackageSources, server_name: str, params: StdioServer | HttpServer) -> bool:
    """Swap the new package in (unless identical) and record the server; returns whether files changed."""
    # Checked again: the server took a while to list its tools.
    root = prepare_tools_dir(given, kernel_writable=[Path.cwd()])
    target = root / sources.package
    with manifest_lock(root):
        for leftover in [*root.glob(f".{sources.package}.new-*"), *root.glob(f".{sources.package}.old-*")]:
            # A previous run died between writing and swapping; its directory is garbage.
            shutil.rmtree(leftover, ignore_errors=True)
        changed = not _same_files(target, sources.files)
        if changed:
            if target.exists() and not target.is_dir():
                raise GenerationError(server_name, f"{str(target)!r} exists and is not a directory")
            staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{sources.package}.new-"))
            try:
                staging.chmod(0o755)
                for name, text in sources.files.items():
                    (staging / name).write_text(text, encoding="utf-8")
                    (staging / name).chmod(0o644)
                if target.exists():
                    old = Path(tempfile.mkdtemp(dir=root, prefix=f".{sources.package}.old-"))
                    target.rename(old / sources.package)
                    try:
                        staging.rename(target)
                    except OSError:
                        (old / sources.package).rename(target)
                        raise
                    shutil.rmtree(old)
                else:
                    staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        save_manifest_entry(root, server_name, params)
    return changed


def _check_server_name(server_name: str, root: Path) -> None:
    if not isinstance(server_name, str) or not server_name.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"server_name must be a non-empty string, got {server_name!r}")
    package = python_identifier(server_name, prefix="server")
    for other in load_manifest(root):
        if other != server_name and python_identifier(other, prefix="server") == package:
            raise UsageError(
                f"server names {other!r} and {server_name!r} both map to the package {package!r} under "
                f"{str(root)!r}; register {server_name!r} under a name that differs in letters or digits"
            )


@dataclass(frozen=True)
class _Client:
    """How generation's client meets the server: its OAuth and what it offers beyond tool calls."""

    oauth: OAuth | None
    features: ClientFeatures


async def _decline_elicitation(context: object, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
    return mcp_types.ElicitResult(action="decline")


async def _decline_sampling(context: object, params: mcp_types.CreateMessageRequestParams) -> mcp_types.ErrorData:
    return mcp_types.ErrorData(
        code=mcp_types.INVALID_REQUEST,
        message="ipybox declines sampling while it lists a server's tools (it answers only during a tool call)",
    )


async def _build_from_server(
    server_name: str, params: StdioServer | HttpServer, timings: dict[str, float], client: _Client
) -> PackageSources:
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errlog:
        return await _build_from_watched_server(server_name, ServerExitWatch(params, errlog), timings, client)


async def _build_from_watched_server(
    server_name: str, watch: ServerExitWatch, timings: dict[str, float], client: _Client
) -> PackageSources:
    sources: PackageSources | None = None
    send, receive = anyio.create_memory_object_stream[_Listing](1)
    try:
        async with anyio.create_task_group() as tg:
            # Loading the model generator takes a while; do it while the server starts up.
            tg.start_soon(lambda: anyio.to_thread.run_sync(warm_up, abandon_on_cancel=True))
            tg.start_soon(_list_tools, server_name, watch, timings, send, client)
            with receive:
                try:
                    listing = await receive.receive()
                except anyio.EndOfStream:
                    listing = None  # the lister failed; leaving the task group raises its error
            if listing is not None:
                start = time.perf_counter()
                sources = await anyio.to_thread.run_sync(
                    lambda: build_package_sources(
                        server_name,
                        listing.tools,
                        server_info=listing.server_info,
                        instructions=listing.instructions,
                        resources=listing.resources,
                        prompts=listing.prompts,
                    )
                )
                timings["generate"] = time.perf_counter() - start
    except BaseExceptionGroup as group:
        # The task group (and the MCP transports inside it) wrap failures in exception groups.
        cause = _first_leaf(group)
        if isinstance(cause, GenerationError | UsageError):
            raise cause from None
        if not isinstance(cause, _CONNECTION_ERRORS):
            raise
        message = str(cause) or type(cause).__name__
        if isinstance(cause, MCPServerError):
            message = message.removeprefix(f"MCP server {server_name!r}: ")
        # The session is closed and the server stopped by now, so its exit status is in.
        ending = watch.describe()
        status, stderr = watch.ending()
        raise GenerationError(
            server_name,
            f"cannot list its tools: {message}" + (f"; {ending}" if ending else ""),
            exit_status=status,
            stderr="\n".join(stderr),
        ) from cause
    if sources is None:
        raise GenerationError(server_name, "listing its tools was cancelled")
    return sources


async def generate_package(
    server_name: str,
    server_params: Mapping[str, Any] | StdioServer | HttpServer,
    root_dir: Path | str,
    *,
    oauth: OAuth | None = None,
    mcp_client: ClientFeatures | None = None,
) -> GenerationReport:
    """Generate the typed package of an MCP server and report what was written.

    Like `generate_mcp_sources`, with the details: renamed tools, tools that got permissive models
    and why, whether anything changed on disk, and timings.

    Raises:
        UsageError: The name or parameters are invalid, the name clashes with another server's, or
            ``root_dir`` is not a tools directory the host can trust (see `generate_mcp_sources`).
        GenerationError: The server could not be reached; nothing was changed.
    """
    began = time.perf_counter()
    params = parse_server_params(server_params)
    root = Path(root_dir)
    # Before its manifest is read: kernel code may have planted the directory or a link to another.
    real = tools_dir_path(root, kernel_writable=[Path.cwd()])
    if real.exists():
        check_tools_dir(real)
    _check_server_name(server_name, real)
    timings: dict[str, float] = {}
    if mcp_client is not None and not isinstance(mcp_client, ClientFeatures):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"mcp_client must be a ClientFeatures, got {mcp_client!r}")
    client = _Client(oauth, mcp_client or ClientFeatures())
    sources = await _build_from_server(server_name, params, timings, client)
    start = time.perf_counter()
    changed = await anyio.to_thread.run_sync(_install, root, sources, server_name, params)
    timings["write"] = time.perf_counter() - start
    timings["total"] = time.perf_counter() - began
    return GenerationReport(server_name, root / sources.package, sources, changed, timings)


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    first: BaseException = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = cast("BaseExceptionGroup[Any]", first).exceptions[0]
    return first


async def generate_mcp_sources(
    server_name: str,
    server_params: Mapping[str, Any] | StdioServer | HttpServer,
    root_dir: Path | str,
    *,
    oauth: OAuth | None = None,
    mcp_client: ClientFeatures | None = None,
) -> list[str]:
    """Generate a typed Python package for the tools of an MCP server.

    Connects to the server, lists its tools and writes ``<root_dir>/<package>/`` with one module
    per tool (``Params``, ``Result`` when the tool has an output schema, ``run`` and ``arun``),
    where ``<package>`` is `server_name` as an identifier. The server parameters are recorded in
    the host-side manifest ``<root_dir>/.ipybox/servers.json``, never in the package. Regenerating
    an unchanged server changes no file.

    Example:
        >>> await generate_mcp_sources("fetch", {"command": "uvx", "args": ["mcp-server-fetch"]}, "mcptools")
        ['fetch']

    Args:
        server_name: The name the server is registered under; generated code calls it by this name.
        server_params: ``{"command": ..., "args": [...], "env": {...}}`` for a stdio server,
            ``{"url": ..., "headers": {...}}`` (optionally ``"type": "sse"``) for an HTTP server,
            or a `StdioServer`/`HttpServer`. ``${VAR}`` placeholders are resolved when connecting.
        root_dir: The tools directory (importable as a package, e.g. ``mcptools``).
        oauth: For a server with ``"oauth"`` in its parameters: how a person authorizes and where
            tokens are kept (`ipybox.oauth.OAuth`; default: the default token store, and no person
            to ask). Pass the same to `CodeExecutor`. Tokens are never written under ``root_dir``.
        mcp_client: What the client offers the server (`ipybox.ClientFeatures`); pass the same as to
            `CodeExecutor`, so that a server that lists tools by its client's capabilities (tools
            that elicit, sample or read roots) lists the same ones to generation and to kernel code.
            Elicitation is always offered; a question asked during generation itself is declined.

    Returns:
        The names of the tool modules written, sorted.

    Raises:
        UsageError: The name or parameters are invalid, or the name clashes with another server's.
            Also when ``root_dir`` is a symlink or goes through one below the current directory
            (kernel code may have planted it to redirect the host's writes), belongs to another
            user, or can be written by others; or its manifest is not a private file of yours.
        GenerationError: The server could not be reached. The previously
            generated package, if any, is left as it was.
    """
    report = await generate_package(server_name, server_params, root_dir, oauth=oauth, mcp_client=mcp_client)
    return list(report.modules)

"""The MCP server's command line (``ipybox mcp``, ``python -m ipybox.mcp_server``).

Every refusal the arguments alone earn is made before the server's stack is imported: mcp, starlette
and uvicorn take a second or more of CPU to import, which a mistyped option should not cost, and an MCP
client that starts the command shows its error at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import anyio

from ipybox._exceptions import UsageError

from ._options import add_arguments, bearer_token, check_exposure, config_from_args, is_loopback

__all__ = ("main", "run_parsed")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the MCP server from the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ipybox.mcp_server")
    add_arguments(parser)
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run the MCP server with arguments parsed by a parser `add_arguments` set up."""
    token = bearer_token(args)
    try:
        config = config_from_args(args)
        # Where `serve` makes a token up (HTTP on a loopback address, none given, no --no-token) there is
        # nothing to refuse; elsewhere its refusal comes now. `serve` checks again.
        if args.transport == "http" and (args.no_token or not is_loopback(args.host)):
            check_exposure(args.host, token, allow_register=config.allow_register)
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    from ._transports import serve  # the server's stack, once the arguments are known to be usable

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        anyio.run(
            lambda: serve(
                config,
                transport=args.transport,
                host=args.host,
                port=args.port,
                token=token,
                no_token=args.no_token,
            )
        )
    except UsageError as exc:
        print(f"ipybox mcp: error: {exc}", file=sys.stderr)
        return 2
    return 0

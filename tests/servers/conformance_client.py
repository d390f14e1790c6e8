"""The client under test of the MCP conformance suite (`@modelcontextprotocol/conformance`): ipybox.

The suite starts a scenario server (and for auth scenarios its own authorization server, all on
localhost) and runs ``python conformance_client.py URL`` with ``MCP_CONFORMANCE_SCENARIO`` and,
for scenarios with credentials, ``MCP_CONFORMANCE_CONTEXT`` in the environment. This client does
what a user of ipybox does: `generate_mcp_sources` with the server's parameters, then a call of a
generated tool module from code in a sandboxed `CodeExecutor`, with one `OAuth` for both.

The suite's authorization server approves at once, answering the authorization URL with a
redirect: the "person" here fetches the URL and returns where it redirects to.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx2

from ipybox import (
    ApprovalDecision,
    ApprovalRequest,
    CodeExecutionResult,
    CodeExecutor,
    ElicitationRequest,
    generate_mcp_sources,
)
from ipybox.oauth import AuthorizationRequest, FileTokenStore, OAuth

# The arguments of the scenario tools this client calls; any other tool is called without.
ARGUMENTS = {"add_numbers": {"a": 5, "b": 3}}
CIMD_URL = "https://conformance-test.local/client-metadata.json"


async def authorize(request: AuthorizationRequest) -> str:
    async with httpx2.AsyncClient() as client:
        response = await client.get(request.url, follow_redirects=False)
    location = response.headers.get("location")
    if response.status_code not in (301, 302, 303, 307, 308) or not location:
        raise RuntimeError(f"the authorization server answered {response.status_code}, not a redirect")
    return location


def server_params(url: str, scenario: str, context: dict[str, Any]) -> dict[str, Any]:
    """The parameters a user would write; secrets as ${VAR} placeholders, resolved on the host."""
    if not scenario.startswith("auth/"):
        return {"url": url}
    oauth: dict[str, Any] = {"redirect_uri": "http://localhost:3000/callback"}
    if scenario == "auth/client-credentials-jwt":
        os.environ["CONFORMANCE_PRIVATE_KEY"] = context["private_key_pem"]
        oauth |= {
            "grant": "client_credentials",
            "client_id": context["client_id"],
            "private_key": "${CONFORMANCE_PRIVATE_KEY}",
            "signing_algorithm": context.get("signing_algorithm", "ES256"),
        }
    elif scenario == "auth/client-credentials-basic":
        os.environ["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
        oauth |= {
            "grant": "client_credentials",
            "client_id": context["client_id"],
            "client_secret": "${CONFORMANCE_CLIENT_SECRET}",
        }
    elif context.get("client_id"):  # a pre-registered client
        oauth["client_id"] = context["client_id"]
        if context.get("client_secret"):
            os.environ["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
            oauth["client_secret"] = "${CONFORMANCE_CLIENT_SECRET}"
    else:
        oauth["client_metadata_url"] = CIMD_URL
    return {"url": url, "oauth": oauth}


def approve(request: ApprovalRequest) -> ApprovalDecision:
    """Every call runs; a server's form question is answered with the defaults its schema gives
    (what the elicitation scenarios check), through ipybox's approval path."""
    if isinstance(request, ElicitationRequest):
        fields: Mapping[str, Mapping[str, Any]] = (request.requested_schema or {}).get("properties") or {}
        content = {name: spec["default"] for name, spec in fields.items() if "default" in spec}
        return ApprovalDecision(approved=True, content=content)
    return ApprovalDecision(approved=True)


async def main(url: str) -> None:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    with tempfile.TemporaryDirectory() as tmp:
        # The tokens beside the workspace, not in it: the executor refuses a kernel that could read them.
        workspace = Path(tmp) / "workspace"
        workspace.mkdir()
        os.chdir(workspace)
        oauth = OAuth(authorize=authorize, store=FileTokenStore(Path(tmp) / "tokens"))
        modules = await generate_mcp_sources("conf", server_params(url, scenario, context), "mcptools", oauth=oauth)
        print(f"generated: {modules}", file=sys.stderr)
        if not modules:
            return
        module = modules[0]
        arguments = ARGUMENTS.get(module, {})
        code = f"from mcptools.conf import {module}\nprint({module}.run({arguments!r}))"
        async with CodeExecutor(workspace=workspace, tools_dir="mcptools", approval=approve, oauth=oauth) as executor:
            result = None
            async for event in executor.execute(code):
                if isinstance(event, CodeExecutionResult):
                    result = event
            print(f"kernel: {result.text if result else None}", file=sys.stderr)


if __name__ == "__main__":
    anyio.run(main, sys.argv[-1])

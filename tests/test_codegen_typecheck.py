"""Generated packages type-check under pyright strict (against the real ipybox_kernel interface)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from codegen_support import EVERYTHING_BIN, SERVERS, everything_params, shapes_params

from ipybox.codegen._codegen import generate_mcp_sources

pytestmark = pytest.mark.anyio

PYRIGHT = Path(sys.executable).parent / "pyright"
# pyright starts node and analyses pydantic; a few tens of seconds on a loaded 2-core machine.
PYRIGHT_TIMEOUT = 100.0


@pytest.mark.skipif(not PYRIGHT.exists(), reason=f"pyright is not installed at {PYRIGHT}; run `uv sync`")
async def test_generated_packages_pass_pyright_strict(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    hostile = [str(SERVERS / "codegen_hostile.py"), "http://127.0.0.1:9/never", str(tmp_path / "marker")]
    await generate_mcp_sources("shapes", shapes_params(), root)
    await generate_mcp_sources("hostile", {"command": sys.executable, "args": hostile}, root)
    packages = ["shapes", "hostile"]
    if EVERYTHING_BIN.exists():
        await generate_mcp_sources("everything", everything_params(), root)
        packages.append("everything")
    venv = Path(sys.prefix)
    config = {
        "include": ["mcptools"],
        "typeCheckingMode": "strict",
        "pythonVersion": "3.11",
        "venvPath": str(venv.parent),
        "venv": venv.name,
    }
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    with anyio.fail_after(PYRIGHT_TIMEOUT):
        result = await anyio.run_process([str(PYRIGHT), "--outputjson"], cwd=tmp_path, check=False)
    report = json.loads(result.stdout)
    problems = [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}" for d in report["generalDiagnostics"]]
    assert problems == []
    expected = sum(len(list((root / p).glob("*.py"))) for p in packages) + 1
    assert report["summary"]["filesAnalyzed"] == expected

"""The OAuth token store and ipybox's data directory are never mounted into the kernel.

A workspace (or sandbox path) that contains them would let kernel code, which runs as the host's
user, read every OAuth token there, or plant a record for a server URL that `FileTokenStore` would
load as its own (same owner, mode 0600). The executor refuses to start instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox import CodeExecutor, SandboxConfig, UsageError
from ipybox.oauth import FileTokenStore, OAuth

pytestmark = pytest.mark.anyio


async def test_a_workspace_that_holds_the_default_data_directory_is_refused_before_any_code_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    store = FileTokenStore(home / ".local" / "share" / "ipybox" / "oauth")
    store.save("https://mcp.example.test/mcp", {"access_token": "secret-token"})
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    with pytest.raises(UsageError, match="OAuth tokens") as refused:
        async with CodeExecutor(workspace=home):
            pytest.fail("the executor started with the token store in its workspace")
    assert str(home / ".local" / "share" / "ipybox") in str(refused.value)


@pytest.mark.parametrize("where", ["workspace", "ro_paths", "rw_paths"])
async def test_a_sandbox_path_that_holds_the_executors_token_directory_is_refused(tmp_path: Path, where: str) -> None:
    shared = tmp_path / "shared"
    store = FileTokenStore(shared / "tokens")
    store.save("https://mcp.example.test/mcp", {"access_token": "secret-token"})
    (tmp_path / "work").mkdir()
    workspace = shared if where == "workspace" else tmp_path / "work"
    sandbox = SandboxConfig(
        ro_paths=[shared] if where == "ro_paths" else [], rw_paths=[shared] if where == "rw_paths" else []
    )
    with pytest.raises(UsageError, match="OAuth tokens"):
        async with CodeExecutor(workspace=workspace, sandbox=sandbox, oauth=OAuth(store=store)):
            pytest.fail("the executor started with the token store mounted into the kernel")
    # A workspace next to the store, not around it, is fine.
    async with CodeExecutor(workspace=tmp_path / "work", oauth=OAuth(store=store)) as executor:
        assert (await executor.execute("print(1)")).text == "1\n"

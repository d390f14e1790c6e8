from __future__ import annotations

import pytest

pytest_plugins = ("servers.fixtures",)


@pytest.fixture
def anyio_backend() -> str:
    # jupyter_client's zmq.asyncio sockets need asyncio; ipybox does not claim trio support.
    return "asyncio"

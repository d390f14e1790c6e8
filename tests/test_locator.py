"""The locator of a suspended execution (issue #31), without a gateway: sealing, verification, what
is refused, and the executor's refusals before any kernel is touched. The whole flow across processes
on a real Kernel Gateway is tests/test_durable_approvals.py."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import pytest

from ipybox import (
    CodeExecutionChunk,
    CodeExecutor,
    ExecutionLost,
    InvalidLocator,
    UsageError,
)
from ipybox._engine._suspension import (
    check_hold,
    pending_request,
    read_locator,
    request_mark,
    seal_locator,
    with_token,
)
from ipybox._gateway._held import HeldCall, HeldKernel
from ipybox.testing import InProcessKernel

SECRET = secrets.token_bytes(32)
TOKEN = secrets.token_urlsafe(32)
LINE = json.dumps(
    {"token": "old-token-of-host-a", "seq": 3, "execution": "m1", "server": "test", "tool": "delete_item",
     "arguments": {"item_id": "x1"}, "mark": 7}
)  # fmt: skip
HELD = HeldKernel(
    url="http://127.0.0.1:8888",
    kernel_id="k1",
    session="s1",
    kernel_session="ks1",
    msg_id="m1",
    calls=(HeldCall("c1", LINE),),
)


def sealed(hold: float = 60.0, secret: bytes = SECRET) -> str:
    output = [CodeExecutionChunk(text="before\n", stream="stdout")]
    return seal_locator(
        HELD,
        code="print(1)",
        key="k",
        timeout=30.0,
        ttl=None,
        output=output,
        hold=hold,
        secret=secret,
        requests=("e1:1",),
        shown="e1:1",
    )


def test_a_sealed_locator_reads_back_as_it_was_made() -> None:
    suspension = read_locator(sealed(), SECRET)
    assert suspension.held == HELD
    assert (suspension.code, suspension.key, suspension.timeout, suspension.ttl) == ("print(1)", "k", 30.0, None)
    assert suspension.output == (CodeExecutionChunk(text="before\n", stream="stdout"),)
    assert (suspension.requests, suspension.shown) == (("e1:1",), "e1:1")


def test_a_signed_locator_that_shows_a_request_it_does_not_hold_is_refused() -> None:
    from ipybox._engine._suspension import _b64, _tag

    body = sealed().split(".")
    payload = json.loads(base64.urlsafe_b64decode(body[2] + "=" * (-len(body[2]) % 4)))
    payload["shown"] = "e1:2"
    signed = f"{body[0]}.{body[1]}.{_b64(json.dumps(payload).encode())}"
    with pytest.raises(InvalidLocator, match="not one ipybox made"):
        read_locator(f"{signed}.{_b64(_tag(SECRET, signed))}", SECRET)


def test_a_locator_holds_nothing_secret() -> None:
    locator = sealed()
    assert SECRET.hex() not in locator and base64.urlsafe_b64encode(SECRET).decode().rstrip("=") not in locator


def changed(locator: str, how: str) -> str:
    if how == "tag":
        return locator[:-2] + ("BB" if locator.endswith("AA") else "AA")
    if how == "payload":
        return locator.replace("ipybox-suspended.1.", "ipybox-suspended.1.A", 1)
    if how == "extra part":
        return locator + "."
    if how == "separator":
        return locator.replace(".", "!", 1)
    return ""


@pytest.mark.parametrize("how", ["tag", "payload", "extra part", "separator", "empty"])
def test_a_changed_locator_is_refused(how: str) -> None:
    with pytest.raises(InvalidLocator):
        read_locator(changed(sealed(), how), SECRET)


def test_another_secret_or_version_or_type_is_refused() -> None:
    with pytest.raises(InvalidLocator, match="signature"):
        read_locator(sealed(), secrets.token_bytes(32))
    with pytest.raises(InvalidLocator, match="version"):
        read_locator(sealed().replace(".1.", ".9.", 1), SECRET)
    with pytest.raises(InvalidLocator):
        read_locator(b"ipybox-suspended", SECRET)


def test_an_expired_locator_is_lost_and_says_nothing_ran() -> None:
    locator = sealed(hold=5.0)
    suspension = read_locator(locator, SECRET)
    with pytest.raises(ExecutionLost, match="nothing was re-run"):
        read_locator(locator, SECRET, now=suspension.expires + 1)


def test_a_signed_payload_ipybox_did_not_make_is_refused() -> None:
    import hashlib
    import hmac

    body = "ipybox-suspended.1." + base64.urlsafe_b64encode(b'{"url": 1}').decode().rstrip("=")
    tag = base64.urlsafe_b64encode(hmac.new(SECRET, body.encode(), hashlib.sha256).digest()).decode().rstrip("=")
    with pytest.raises(InvalidLocator, match="not one ipybox made"):
        read_locator(f"{body}.{tag}", SECRET)


def test_holds_and_lines() -> None:
    assert check_hold(3600) == 3600.0
    for bad in (0, -1, float("inf"), True, "60"):
        with pytest.raises(UsageError):
            check_hold(bad)
    replaced = with_token(LINE, TOKEN)
    assert json.loads(replaced)["token"] == TOKEN
    assert {k: v for k, v in json.loads(replaced).items() if k != "token"} == {
        k: v for k, v in json.loads(LINE).items() if k != "token"
    }
    assert with_token("not json", TOKEN) == "not json"
    assert request_mark(LINE) == 7 and request_mark("[1]") is None
    request = pending_request(replaced, TOKEN)
    assert request is not None and request.arguments == {"item_id": "x1"}
    assert pending_request(LINE, TOKEN) is None  # the old host's token is not this host's


@pytest.mark.anyio
async def test_the_executor_refuses_what_cannot_be_suspended_or_resumed_here(tmp_path: Path) -> None:
    async with CodeExecutor(workspace=tmp_path, sandbox=None, tools_dir=None, kernel=InProcessKernel()) as ex:
        execution = ex.execute("1")
        await execution
        with pytest.raises(UsageError, match="only the running execution"):
            await ex.suspend(execution, secret=SECRET, ttl=60)
        with pytest.raises(UsageError, match="32"):
            await ex.suspend(execution, secret=b"short", ttl=60)
        with pytest.raises(UsageError, match="ttl"):
            await ex.suspend(execution, secret=SECRET, ttl=0)
        with pytest.raises(InvalidLocator):
            ex.resume(sealed(), secret=secrets.token_bytes(32))
        # Genuine, but this executor's kernels are not on that gateway.
        with pytest.raises(UsageError, match="GatewayKernel at that URL"):
            ex.resume(sealed(), secret=SECRET)
        # Genuine, but of another code action than the one the application resumes (a locator copied
        # from another thread's or action's state): refused before anything else.
        with pytest.raises(InvalidLocator, match="another code action"):
            ex.resume(sealed(), secret=SECRET, key="langchain:another-thread:call-1")
        with pytest.raises(UsageError, match="GatewayKernel at that URL"):
            ex.resume(sealed(), secret=SECRET, key="k")

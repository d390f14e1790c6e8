"""The locator of a suspended execution: what a new process needs to resume it, sealed with the
application's secret.

Format (version 1)::

    ipybox-suspended.1.<payload>.<tag>

``payload`` is base64url (unpadded) JSON; ``tag`` is base64url HMAC-SHA256, under the application's
secret, of everything before it (``ipybox-suspended.1.<payload>``). The tag is checked, in constant
time, before the payload is parsed: a locator not made with the secret is refused without reading
it, and one that was changed anywhere (an argument, the kernel, the expiry) fails the check. The
payload holds nothing secret: the gateway URL and kernel id, the websocket's Jupyter session, the
kernel process's session, the execute request's id, the pending calls' request lines as the
suspending host got them with the id of the `ApprovalRequest` each was asked as, which of them was
shown to a person (the one a decision on resume answers), the code, the output sent before the pause
and the expiry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ipybox._exceptions import ExecutionLost, InvalidLocator, UsageError
from ipybox._gateway._held import HeldCall, HeldKernel
from ipybox._toolserver._boundary import ToolCallFailed
from ipybox._toolserver._channel import ToolRequest
from ipybox._toolserver._parse import parse_request

from ._results import CodeExecutionChunk

__all__ = (
    "MIN_SECRET_BYTES",
    "Suspension",
    "check_hold",
    "check_secret",
    "decide_once",
    "pending_request",
    "read_locator",
    "request_mark",
    "seal_locator",
    "with_token",
)

PREFIX = "ipybox-suspended"
VERSION = 1
# HMAC-SHA256 keys shorter than its output weaken it; an application's secret must not be a password.
MIN_SECRET_BYTES = 32
# Suspensions whose decision this process has applied (`decide_once`): bounded, oldest dropped first;
# a locator's own expiry ends its use sooner than this many newer resumes with a decision push it out.
_DECIDED_KEPT = 100_000
_decided: OrderedDict[str, None] = OrderedDict()
# A locator larger than this was not made by ipybox (its output and calls are bounded far below).
MAX_LOCATOR_CHARS = 256 * 1024 * 1024


class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    id: str = Field(min_length=1, max_length=64)
    line: str
    request: str = Field(min_length=1, max_length=1024)
    """The id of the `ApprovalRequest` the suspending host asked this call as."""


class _Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    text: str
    stream: Literal["stdout", "stderr", "result"]


class _Payload(BaseModel):
    """The locator's content (pydantic: it is read back from outside the process)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    url: str
    kernel: str = Field(min_length=1, max_length=128)
    session: str = Field(min_length=1, max_length=128)
    kernel_session: str = Field(min_length=1, max_length=1024)
    msg_id: str = Field(min_length=1, max_length=1024)
    calls: list[_Call] = Field(min_length=1)
    shown: str = Field(min_length=1, max_length=1024)
    """The request id, of one of ``calls``, shown to a person: a decision on resume answers it."""
    code: str
    key: str | None
    timeout: float | None
    ttl: float | None
    output: list[_Chunk]
    suspended: float
    expires: float
    nonce: str


@dataclass(frozen=True, slots=True)
class Suspension:
    """A locator read back and verified."""

    held: HeldKernel
    code: str
    key: str | None
    timeout: float | None
    ttl: float | None
    """The execution's own ttl (seconds one approval may wait), not the suspension's."""
    output: tuple[CodeExecutionChunk, ...]
    expires: float
    """When the suspension's hold ends (seconds since the epoch)."""
    requests: tuple[str, ...]
    """Per call of ``held.calls``, the id of the `ApprovalRequest` it was asked as before."""
    shown: str
    """Which of ``requests`` was shown to a person: the one a decision on resume answers."""
    nonce: str
    """This suspension's own random id."""


def check_secret(secret: object) -> bytes:
    """The application's HMAC secret, checked.

    Raises:
        UsageError: It is not bytes of at least `MIN_SECRET_BYTES`.
    """
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise UsageError(
            f"secret must be bytes of at least {MIN_SECRET_BYTES} random bytes (secrets.token_bytes(32)), kept by "
            "the application where no kernel can read it; the same secret on every worker that resumes"
        )
    return secret


def seal_locator(
    held: HeldKernel,
    *,
    code: str,
    key: str | None,
    timeout: float | None,
    ttl: float | None,
    output: list[CodeExecutionChunk],
    hold: float,
    secret: bytes,
    requests: tuple[str, ...],
    shown: str,
) -> str:
    """The locator of a suspended execution, sealed with ``secret``; it expires ``hold`` seconds from now.
    ``requests``: the request id of each of ``held.calls``; ``shown``: the one shown to a person."""
    assert len(requests) == len(held.calls) and shown in requests
    now = time.time()
    payload = _Payload(
        url=held.url,
        kernel=held.kernel_id,
        session=held.session,
        kernel_session=held.kernel_session,
        msg_id=held.msg_id,
        calls=[
            _Call(id=call.call_id, line=call.line, request=request)
            for call, request in zip(held.calls, requests, strict=True)
        ],
        shown=shown,
        code=code,
        key=key,
        timeout=timeout,
        ttl=ttl,
        output=[_Chunk(text=chunk.text, stream=chunk.stream) for chunk in output],
        suspended=now,
        expires=now + hold,
        nonce=secrets.token_hex(16),
    )
    body = f"{PREFIX}.{VERSION}.{_b64(payload.model_dump_json().encode())}"
    return f"{body}.{_b64(_tag(secret, body))}"


def read_locator(locator: object, secret: bytes, *, now: float | None = None) -> Suspension:
    """Verify a locator and read it.

    Raises:
        InvalidLocator: It is not a locator, of another version, or its tag does not match (another
            secret, or changed).
        ExecutionLost: It is genuine but expired: the kernel has released the execution.
    """
    if not isinstance(locator, str) or len(locator) > MAX_LOCATOR_CHARS:
        raise InvalidLocator("not a locator of a suspended execution (expected the str CodeExecutor.suspend returned)")
    parts = locator.split(".")
    if len(parts) != 4 or parts[0] != PREFIX:
        raise InvalidLocator("not a locator of a suspended execution (expected 'ipybox-suspended.<version>.…')")
    if parts[1] != str(VERSION):
        raise InvalidLocator(f"a locator of version {parts[1][:16]!r}; this ipybox reads version {VERSION}")
    body = ".".join(parts[:3])
    try:
        tag = _unb64(parts[3])
        raw = _unb64(parts[2])
    except (ValueError, binascii.Error):
        raise InvalidLocator("the locator is damaged (not base64url)") from None
    if not hmac.compare_digest(tag, _tag(secret, body)):
        raise InvalidLocator(
            "the locator's signature does not match: it was made with another secret, or changed after it was made"
        )
    try:
        payload = _Payload.model_validate_json(raw)
    except ValidationError:
        # Signed with the secret, yet not ours: another program shares the secret, which it must not.
        raise InvalidLocator("the locator is signed with this secret but is not one ipybox made") from None
    if payload.shown not in {call.request for call in payload.calls}:
        raise InvalidLocator("the locator is signed with this secret but is not one ipybox made")
    now = time.time() if now is None else now
    if not now < payload.expires:
        raise ExecutionLost(
            f"the suspended execution expired {now - payload.expires:.0f} s ago (its hold of "
            f"{payload.expires - payload.suspended:g} s ran out) and was released; nothing was re-run"
        )
    held = HeldKernel(
        url=payload.url,
        kernel_id=payload.kernel,
        session=payload.session,
        kernel_session=payload.kernel_session,
        msg_id=payload.msg_id,
        calls=tuple(HeldCall(call.id, call.line) for call in payload.calls),
    )
    return Suspension(
        held=held,
        code=payload.code,
        key=payload.key,
        timeout=payload.timeout,
        ttl=payload.ttl,
        output=tuple(CodeExecutionChunk(text=chunk.text, stream=chunk.stream) for chunk in payload.output),
        expires=payload.expires,
        requests=tuple(call.request for call in payload.calls),
        shown=payload.shown,
        nonce=payload.nonce,
    )


def decide_once(suspension: Suspension) -> None:
    """Record that this process applies a decision to ``suspension``'s shown call, once.

    Raises:
        ExecutionLost: This process applied a decision to it already (the same locator resumed again,
            which an honest kernel refuses anyway): it is not applied to the call a second time.
    """
    if suspension.nonce in _decided:
        raise ExecutionLost(
            f"a decision on request {suspension.shown!r} of this suspended execution was applied already; "
            "it is applied once, and nothing was re-run"
        )
    _decided[suspension.nonce] = None
    while len(_decided) > _DECIDED_KEPT:
        _decided.popitem(last=False)


def check_hold(ttl: object) -> float:
    """A suspension's hold in seconds, checked.

    Raises:
        UsageError: Not a positive, finite number of seconds.
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise UsageError(f"ttl must be a positive, finite number of seconds (hours are fine), got {ttl!r}")
    return float(ttl)


def with_token(line: str, token: str) -> str:
    """A pending call's request line with this host's tool token instead of the suspending host's (a
    line that is no JSON object is left as it is: the tool server refuses it as it would have)."""
    request = _request(line)
    if request is None:
        return line
    request["token"] = token
    return json.dumps(request, separators=(",", ":"))


def pending_request(line: str, token: str) -> ToolRequest | None:
    """A pending call's request as the tool server will read it (None: it will refuse it)."""
    try:
        return parse_request(line.encode(errors="surrogatepass"), token.encode())
    except ToolCallFailed:
        return None


def request_mark(line: str) -> int | None:
    """The output mark a pending call's request line names, if any."""
    mark = (_request(line) or {}).get("mark")
    return mark if isinstance(mark, int) and not isinstance(mark, bool) else None


def _request(line: str) -> dict[str, Any] | None:
    try:
        request: object = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return request if isinstance(request, dict) else None  # pyright: ignore[reportUnknownVariableType]


def _tag(secret: bytes, body: str) -> bytes:
    return hmac.new(secret, body.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    # Strict: every character counts, as the tag covers the text.
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)

"""The host↔kernel contract (``ipybox_kernel._protocol``): one module, both sides on it.

Pure functions on both sides of the tool channel: the host's error reply as it goes on the wire, the
kernel's parsing of that line into an exception. No kernel is started; the channel itself is
exercised end to end by tests/test_toolserver.py and tests/hostile/test_tool_channel.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

import ipybox_kernel
from ipybox._gateway._push import setup_cells
from ipybox._toolserver import _channel
from ipybox._toolserver._boundary import ToolCallFailed
from ipybox._toolserver._channel import ToolErrorReply, ToolResultReply, encode_reply
from ipybox_kernel import _protocol, _transport
from ipybox_kernel._client import _parse_reply
from ipybox_kernel._errors import ERROR_TYPES, ToolCallError


def test_every_error_kind_the_host_can_send_raises_its_exception_in_the_kernel() -> None:
    assert _channel.ErrorKind is _protocol.ErrorKind
    kinds = set(get_args(_channel.ErrorKind))
    assert kinds == set(_protocol.ERROR_KINDS) == set(ERROR_TYPES), (
        "every error kind of the contract must map to an exception in ipybox_kernel._errors.ERROR_TYPES"
    )
    for kind in sorted(kinds):
        failed = ToolCallFailed(kind, f"srv.tool failed ({kind})", reason="why", timeout=2.5, output="last lines")
        line = encode_reply(failed.reply(7))
        with pytest.raises(ToolCallError) as caught:
            _parse_reply("srv", "tool", line)
        error = caught.value
        assert type(error) is ERROR_TYPES[kind], kind
        assert (error.server_name, error.tool_name, error.message) == ("srv", "tool", f"srv.tool failed ({kind})")
        for name, value in (("reason", "why"), ("timeout", 2.5), ("output", "last lines")):
            if name in vars(error):
                assert getattr(error, name) == value, (kind, name)


def test_a_kind_outside_the_contract_is_refused_by_the_host_and_generic_in_the_kernel() -> None:
    with pytest.raises(ValidationError):
        ToolErrorReply(seq=1, error="not_a_kind", message="x")  # pyright: ignore[reportArgumentType]
    # A newer host's kind reaches an older kernel as a plain failure, not as a crash of the parser.
    with pytest.raises(ToolCallError) as caught:
        _parse_reply("srv", "tool", b'{"seq": 1, "ok": false, "error": "not_a_kind", "message": "m"}\n')
    assert type(caught.value) is ToolCallError and caught.value.message == "m"


def test_an_unmarked_reply_reads_the_same_and_spares_only_that_executions_marks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_transport, "_unmarked", None)
    result = ToolResultReply(seq=3, structured={"x": 1}, text="t", content=[{"type": "text", "text": "t"}])
    plain, unmarked = encode_reply(result), encode_reply(result, unmarked=True)
    assert unmarked.endswith(b',"unmarked":true}\n') and unmarked.count(b"\n") == 1
    assert _parse_reply("srv", "tool", plain, "cell-1") == _parse_reply("srv", "tool", unmarked, None)
    assert _transport._unmarked is None  # no execution named, nothing noted
    _parse_reply("srv", "tool", plain, "cell-1")
    assert _transport._unmarked is None
    _parse_reply("srv", "tool", unmarked, "cell-1")
    assert _transport._unmarked == "cell-1"
    with pytest.raises(ToolCallError):
        _parse_reply(
            "srv", "tool", encode_reply(ToolErrorReply(seq=4, error="rejected", message="m"), unmarked=True), "cell-2"
        )
    assert _transport._unmarked == "cell-2"


def test_the_contract_is_standard_library_only() -> None:
    # The sandboxed kernel imports it without ipybox's dependencies (and a remote kernel gets it as source).
    tree = ast.parse(Path(_protocol.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the contract imports nothing of ipybox_kernel either"
            imported.add((node.module or "").split(".")[0])
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_contract_is_pushed_to_a_gateway_kernel() -> None:
    cells = setup_cells(tools_dir=None, token="t" * 32, output_chars=1000, message_bytes=10_000, push=True)
    pushed = _pushed_files(cells)
    kernel_modules = {f"ipybox_kernel/{p.name}" for p in Path(ipybox_kernel.__file__).parent.glob("*.py")}
    assert "ipybox_kernel/_protocol.py" in pushed
    assert kernel_modules <= set(pushed)
    assert pushed["ipybox_kernel/_protocol.py"] == Path(_protocol.__file__).read_text(encoding="utf-8")
    # The environment the start-up cell sets is named by the contract, not spelled out again.
    finish = _cell_source(cells[-1])
    assert f"os.environ[{_protocol.TOKEN_ENV!r}] = {'t' * 32!r}" in finish


def _cell_source(cell: str) -> str:
    """The code of a cell ``exec(<code>, {})``."""
    call = ast.parse(cell).body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    source = ast.literal_eval(call.value.args[0])
    assert isinstance(source, str)
    return source


def _pushed_files(cells: list[str]) -> dict[str, str]:
    """The files the chunk cells carry, decoded as the kernel decodes them."""
    import base64
    import json
    import zlib

    data = ""
    for cell in cells[:-1]:
        for node in ast.walk(ast.parse(_cell_source(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "b64decode":
                data += ast.literal_eval(node.args[0])
    return json.loads(zlib.decompress(base64.b64decode(data)))

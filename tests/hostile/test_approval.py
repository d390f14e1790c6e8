"""Approval under abuse: floods of requests, and arguments that change after the request was made."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from ipybox import ApprovalRequest, CodeExecutionChunk, CodeExecutionResult, CodeExecutor

from .conftest import run

pytestmark = pytest.mark.anyio

# Calls in one cell for the flood tests: thousands, as a runaway loop in model code would make.
AUTO_FLOOD = 2000
ASK_FLOOD = 1000
# Threads in the parallel flood; the kernel client carries at most this many calls at once anyway.
FLOOD_THREADS = 32


def flood(calls: int, threads: int = 1) -> str:
    return (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from ipybox_kernel import call_tool\n"
        "def one(i):\n    return int(call_tool('test', 'add', {'a': i, 'b': 1}).text)\n"
        f"with ThreadPoolExecutor({threads}) as pool:\n"
        f"    results = list(pool.map(one, range({calls})))\n"
        f"print(sum(results) == sum(range({calls})) + {calls}, len(results))\n"
    )


async def test_thousands_of_calls_in_one_cell_under_auto_are_all_approved_and_run(
    module_workspace: Path, tools_dir: Path
) -> None:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="auto") as ex:
        result = await run(ex, flood(AUTO_FLOOD, FLOOD_THREADS), timeout=100)
        assert result.text == f"True {AUTO_FLOOD}\n"
        assert (await run(ex, "print('after')")).text == "after\n"


async def test_a_flood_under_ask_surfaces_every_request_once_and_runs_only_approved_calls(
    module_workspace: Path, tools_dir: Path
) -> None:
    seen: set[str] = set()
    rejected = 0
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="ask") as ex:
        code = (
            "from concurrent.futures import ThreadPoolExecutor\n"
            "from ipybox_kernel import call_tool, ToolCallRejected\n"
            "def one(i):\n"
            "    try:\n        return int(call_tool('test', 'add', {'a': i, 'b': 0}).text)\n"
            "    except ToolCallRejected:\n        return None\n"
            f"with ThreadPoolExecutor({FLOOD_THREADS}) as pool:\n"
            f"    results = list(pool.map(one, range({ASK_FLOOD})))\n"
            "ran = [r for r in results if r is not None]\n"
            "print(len(ran), all(r % 7 for r in ran))\n"
        )
        result: CodeExecutionResult | None = None
        async for event in ex.execute(code):
            if isinstance(event, ApprovalRequest):
                assert event.id not in seen
                seen.add(event.id)
                # Reject every call whose first argument is a multiple of 7.
                if event.tool_args["a"] % 7 == 0:
                    rejected += 1
                    await event.reject("multiple of seven")
                else:
                    await event.accept()
            elif isinstance(event, CodeExecutionResult):
                result = event
        assert result is not None
        assert len(seen) == ASK_FLOOD
        assert result.text == f"{ASK_FLOOD - rejected} True\n"


async def test_the_call_that_runs_has_exactly_the_arguments_that_were_approved(
    module_workspace: Path, tools_dir: Path
) -> None:
    """The kernel mutates its argument dict, nested values included, while the approval is pending."""
    pending = module_workspace / "approval-pending"
    pending.unlink(missing_ok=True)
    # The kernel blocks on this FIFO until the host has seen the request and writes to it.
    os.mkfifo(pending)
    code = (
        "import threading\n"
        "from ipybox_kernel import call_tool\n"
        "args = {'customer': {'name': 'Alice', 'address': {'street': 'a', 'city': 'Approved City', 'country': 'DE'}},"
        " 'items': [{'sku': 'ABC-123', 'quantity': 1, 'unit_price': 1.0}]}\n"
        "box = {}\n"
        "worker = threading.Thread(target=lambda: box.setdefault('out', call_tool('test', 'create_order', args)))\n"
        "worker.start()\n"
        # The host tells the kernel it has seen the request through a FIFO; there is no other signal.
        f"with open({str(pending)!r}, 'rb') as fifo:\n"
        "    fifo.read(1)\n"
        "args['customer']['address']['city'] = 'Evil City'\n"
        "args['items'][0]['quantity'] = 100\n"
        "args['priority'] = 'urgent'\n"
        "print('mutated', flush=True)\n"
        "worker.join()\n"
        "print(box['out'].text)\n"
    )
    approved: list[dict[str, Any]] = []

    def seen() -> None:
        with pending.open("wb") as fifo:  # opens once the kernel has the FIFO open for reading
            fifo.write(b"x")

    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="ask") as ex:
        result: CodeExecutionResult | None = None
        request: ApprovalRequest | None = None
        with anyio.fail_after(60):
            async for event in ex.execute(code):
                if isinstance(event, ApprovalRequest):
                    request = event
                    approved.append(dict(event.tool_args))
                    await anyio.to_thread.run_sync(seen, abandon_on_cancel=True)
                elif isinstance(event, CodeExecutionChunk) and "mutated" in event.text:
                    assert request is not None
                    await request.accept()
                elif isinstance(event, CodeExecutionResult):
                    result = event
    pending.unlink()
    assert result is not None
    assert approved[0]["customer"]["address"]["city"] == "Approved City"
    assert "to Approved City, DE: 1 items, total 1.00, priority normal" in result.text


def force(mapping: Mapping[str, Any], key: str, value: object) -> None:
    """Change a read-only mapping the way determined code could, past its guard."""
    plain: dict[str, Any] = {}
    type(plain).__setitem__(cast("dict[str, Any]", mapping), key, value)


async def test_approval_of_a_call_whose_arguments_change_after_the_request_runs_what_was_approved(
    module_workspace: Path, tools_dir: Path
) -> None:
    """The application (a callback here, or an event consumer) gets a read-only copy: changing it
    fails, and even a change forced past the guard does not reach the call."""
    seen: list[str] = []

    def meddle(request: ApprovalRequest) -> bool:
        args: Any = request.tool_args  # used as an untyped application would
        for attempt in (
            lambda: args.__setitem__("priority", "urgent"),
            lambda: args["customer"]["address"].update(city="Evil City"),
            lambda: args["items"][0].pop("quantity"),
        ):
            with pytest.raises(TypeError, match="read-only"):
                attempt()
        with pytest.raises(AttributeError):
            args["items"].append({"sku": "EVIL", "quantity": 1, "unit_price": 0.0})  # a tuple
        # Forced past the guard: this changes the application's copy only.
        force(args["customer"]["address"], "city", "Evil City")
        force(args, "priority", "urgent")
        seen.append(json.dumps(args, sort_keys=True))
        return True

    code = (
        "from ipybox_kernel import call_tool\n"
        "args = {'customer': {'name': 'Alice', 'address': {'street': 'a', 'city': 'Approved City', 'country': 'DE'}},"
        " 'items': [{'sku': 'ABC-123', 'quantity': 1, 'unit_price': 1.0}]}\n"
        "print(call_tool('test', 'create_order', args).text)\n"
    )
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval=meddle) as ex:
        result = await run(ex, code)
        assert "to Approved City, DE: 1 items, total 1.00, priority normal" in result.text
        assert len(seen) == 1 and '"city": "Evil City"' in seen[0]

    # Under "ask" the event consumer gets the same kind of copy; a deep copy of it is an ordinary dict.
    add = "from ipybox_kernel import call_tool\nprint(call_tool('test', 'add', {'a': 2, 'b': 3}).text)\n"
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, approval="ask") as ex:
        result: CodeExecutionResult | None = None
        async for event in ex.execute(add):
            if isinstance(event, ApprovalRequest):
                mine = cast("dict[str, Any]", copy.deepcopy(event.tool_args))
                assert type(mine) is dict
                mine["a"] = 100
                force(event.tool_args, "b", 100)
                await event.accept()
            elif isinstance(event, CodeExecutionResult):
                result = event
        assert result is not None
        assert result.text == "5\n"

"""What tracing that is off does per code action and per tool call, counted rather than timed (a busy
machine bends times; the calls made do not change): with no tracer configured a code action's span
is made without hashing the code or building attributes, a tool call makes no more calls than with
no tracer at all, a loop's calls split their code into lines once, and an SDK the application
configures after ipybox was imported is followed from the next code action on."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

import pytest

from ipybox import Tracing
from ipybox._engine._callsite import call_site_of
from ipybox._engine._execution import open_execution
from ipybox._engine._gate import ApprovalGate
from ipybox._engine._tracing import ActionTracer
from ipybox._kernel import KernelHandle
from ipybox._toolserver._channel import ToolRequest

pytestmark = pytest.mark.anyio

Event = tuple[str, Any]


def profiled(run: Callable[[], object]) -> list[Event]:
    """Every Python and C function call ``run`` makes, in order: (kind, the function's name or object)."""
    seen: list[Event] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(("call", frame.f_code.co_name))
        elif event == "c_call":
            seen.append(("c_call", arg))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def test_a_code_action_span_with_spans_off_hashes_nothing_and_sets_no_attributes() -> None:
    tracer = ActionTracer(Tracing())  # the global API, no SDK configured (no test sets one)
    assert not tracer.configured()
    code = "x = 1\n" * 10_000

    def action() -> None:
        span = tracer.start_action(execution_id="e1", key="k", code=code, parent=None)
        assert not span.is_recording()
        ActionTracer.end_action(span, None, None, _account())

    events = profiled(action)
    names = {getattr(fn, "__name__", fn) for _, fn in events}
    assert not names & {"openssl_sha256", "sha256", "hexdigest"}, names
    assert not names & {"set_attribute", "set_attributes", "bounded"}, names


async def test_a_tool_call_with_spans_off_makes_hardly_more_calls_than_untraced() -> None:
    untraced = await _calls_per_tool_call(None)
    off = await _calls_per_tool_call(ActionTracer(Tracing()))
    # is_recording() once per call, and the span context's validity once: no span, no attributes.
    assert off - untraced <= 4, (untraced, off)


def test_a_loops_calls_split_the_code_into_lines_once() -> None:
    code = "\n".join(f"v{i} = call_tool('s', 't', {{}})" for i in range(500))

    def calls() -> None:
        for line in range(1, 201):
            assert call_site_of(code, line, None).text == f"v{line - 1} = call_tool('s', 't', {{}})"

    splits = [fn for kind, fn in profiled(calls) if kind == "c_call" and _is_pattern_split(fn)]
    assert len(splits) <= 1


def test_an_sdk_configured_after_import_is_followed_from_the_next_code_action() -> None:
    # The global provider can be set once per process: a process of its own.
    script = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from ipybox import Tracing
        from ipybox._engine._results import ActionAccount
        from ipybox._engine._tracing import ActionTracer

        tracer = ActionTracer(Tracing())  # made before the application configures the SDK
        before = tracer.start_action(execution_id="e1", key=None, code="1", parent=None)
        assert not tracer.configured() and not before.is_recording()
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert tracer.configured()
        after = tracer.start_action(execution_id="e2", key=None, code="1", parent=None)
        ActionTracer.end_action(after, None, None, ActionAccount(tool_calls=3))
        [span] = exporter.get_finished_spans()
        attrs = dict(span.attributes or {})
        assert attrs["ipybox.execution.id"] == "e2" and attrs["ipybox.tool_calls"] == 3, attrs
        assert "ipybox.code.sha256" in attrs
        print("followed")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "followed"


def _is_pattern_split(fn: Any) -> bool:
    return getattr(fn, "__name__", None) == "split" and isinstance(getattr(fn, "__self__", None), re.Pattern)


def _account() -> Any:
    from ipybox._engine._results import ActionAccount

    return ActionAccount()


class _Unobserved:
    """The gate's only use of a kernel on this path: its left-behind tasks, not observable here (as on
    a gateway), so that what is counted is the gate's own work."""

    # The host sees no thread of this kernel, but no earlier action left one: nothing to state.
    unseen = False

    def live_tasks(self) -> None:
        return None


async def _calls_per_tool_call(tracer: ActionTracer | None) -> int:
    """Function calls (Python and C) one approved tool call makes through the gate, its trace context and
    its finished report, as the ToolServer drives them; the second call is counted (the first warms)."""
    gate = ApprovalGate("auto", None, None, tracer=tracer)
    execution, driver = open_execution("pass", key=None, timeout=None)
    if tracer is not None:
        driver.span = tracer.start_action(execution_id=execution.id, key=None, code="pass", parent=None)
    request = ToolRequest(token="t" * 16, seq=1, execution="msg", server="s", tool="t", arguments={"a": 1})
    counts: list[int] = []
    async with gate.running(driver, "msg", kernel=cast("KernelHandle", _Unobserved())):
        for _ in range(2):
            seen: list[int] = [0]

            def profile(frame: FrameType, event: str, arg: Any, seen: list[int] = seen) -> None:
                if event in ("call", "c_call"):
                    seen[0] += 1

            sys.setprofile(profile)
            try:
                decision = await gate.tool(request, server="s", annotations=None, input_schema=None)
                gate.trace_context(request)
                await gate.finished(request, None)
            finally:
                sys.setprofile(None)
            assert decision.approved
            counts.append(seen[0])
    execution.cancel()
    return counts[-1]

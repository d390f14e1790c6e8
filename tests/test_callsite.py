"""The line of a code action that made each tool call: reported by the kernel as a number, rendered by
the host from its own copy of the code, on `ApprovalRequest` (its description) and on the call's span.
From the cell, from a function an earlier cell defined, from a skill; on a real sandboxed kernel and
the in-process test kernel; and forged reports, which can point at another line of the same code or
at none, but never show text of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from approval_support import collect
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ipybox import ApprovalRequest, CallSite, CodeExecutor, Tracing
from ipybox._approval._rendering import request_text
from ipybox._engine._callsite import LINE_CHARS, call_site_of
from ipybox.testing import InProcessKernel

pytestmark = pytest.mark.anyio

GREETER = '''"""Greets someone through the test MCP server."""
from mcptools.test import greet


def run(name: str) -> str:
    """The server's greeting."""
    return greet.run(greet.Params(name=name))
'''


@pytest.fixture(params=["sandboxed", "in_process"])
def kernel_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def executor_for(kind: str, workspace: Path, tools_dir: Path, **options: object) -> CodeExecutor:
    if kind == "in_process":
        return CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=InProcessKernel(), sandbox=None, **options)  # pyright: ignore[reportArgumentType]
    return CodeExecutor(workspace=workspace, tools_dir=tools_dir, **options)  # pyright: ignore[reportArgumentType]


def made_at(request: ApprovalRequest) -> str:
    [line] = [line for line in request.description.split("\n") if line.startswith("Made at: ")]
    return line


async def test_a_cell_that_starts_with_blank_lines_is_numbered_as_the_kernel_numbers_it(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    # IPython drops a cell's leading blank lines before it compiles it; the host counts alike.
    call = "greet.run(greet.Params(name='site'))"
    code = f"\n  \n\t\nfrom mcptools.test import greet\n{call}\n"
    async with executor_for(kernel_kind, workspace, tools_dir) as executor:
        [request], _ = await collect(executor, code)
    assert request.call_site == CallSite(line=2, text=call, module=None)


async def test_a_call_from_the_cell_names_its_line_and_shows_the_hosts_text(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    call = "reply = greet.run(greet.Params(name='site'))  # the call"
    code = f"from mcptools.test import greet\n\nx = 1\n{call}\nprint(x)"
    async with executor_for(kernel_kind, workspace, tools_dir) as executor:
        [request], result = await collect(executor, code)
    assert result.text.strip() == "1"
    assert request.call_site == CallSite(line=4, text=call, module=None)
    assert made_at(request) == f"Made at: line 4 of the code action: {call}"
    # Under the headline, before the arguments.
    assert request.description.split("\n")[1] == made_at(request)


async def test_a_call_from_a_function_of_an_earlier_cell_names_the_line_that_called_it(
    kernel_kind: str, tools_dir: Path, workspace: Path
) -> None:
    earlier = (
        "from ipybox_kernel import call_tool\n"
        "def helper(name):\n"
        "    return call_tool('test', 'greet', {'name': name})\n"
    )
    code = "# a comment\nfor name in ['a']:\n    helper(name)\n"
    seen: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> bool:  # a callback sees the same request, call site included
        seen.append(request)
        return True

    async with executor_for(kernel_kind, workspace, tools_dir, approval=approve) as executor:
        await executor.execute(earlier)
        await executor.execute(code)
    [request] = seen
    assert request.call_site == CallSite(line=3, text="helper(name)", module=None)


async def test_an_awaited_call_names_its_line(tools_dir: Path, workspace: Path) -> None:
    code = "from mcptools.test import greet\nimport asyncio\n\nawait greet.arun(greet.Params(name='a'))"
    async with executor_for("in_process", workspace, tools_dir) as executor:
        [request], _ = await collect(executor, code)
    assert request.call_site is not None and request.call_site.line == 4
    assert request.call_site.text == "await greet.arun(greet.Params(name='a'))"


async def test_a_call_from_a_skill_says_which_module_it_came_through(
    kernel_kind: str, tools_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    skills = tmp_path / "skills"
    async with executor_for(kernel_kind, workspace, tools_dir, skills_dir=skills) as executor:
        await executor.save_skill("greeter", GREETER, description="Greets someone")
        [request], result = await collect(executor, "from skills.greeter import run\nprint(run('skill'))")
    assert "skill" in result.text
    assert request.call_site == CallSite(line=2, text="print(run('skill'))", module="skills.greeter")
    assert made_at(request).endswith(": print(run('skill')), through module skills.greeter")


async def test_the_call_site_is_on_the_calls_span(tools_dir: Path, workspace: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    code = "from mcptools.test import greet\ngreet.run(greet.Params(name='a'))"
    for values in (False, True):
        exporter.clear()
        tracing = Tracing(tracer_provider=provider, values=values)
        async with executor_for("in_process", workspace, tools_dir, tracing=tracing) as executor:
            await collect(executor, code)
        [span] = [span for span in exporter.get_finished_spans() if span.name == "execute_tool greet"]
        attributes = dict(span.attributes or {})
        assert attributes["code.line.number"] == 2
        # The line's text may hold argument values: only with them.
        assert attributes.get("ipybox.call_site.text") == ("greet.run(greet.Params(name='a'))" if values else None)


# -- forged reports ---------------------------------------------------------------------------------

CODE = "a = 1\nb = call()\n"


@pytest.mark.parametrize("line", [0, -1, 3 + 1, 10**30, -(10**30), True, None])
def test_a_line_the_code_does_not_have_is_unknown_and_shows_no_text(line: object) -> None:
    site = call_site_of(CODE, line, None)
    assert site.line is None and site.text is None
    assert str(site) == "an unknown line (the kernel reported no line of this code action's code)"


def test_a_reported_line_shows_only_the_hosts_text_of_it() -> None:
    assert call_site_of(CODE, 2, None) == CallSite(line=2, text="b = call()", module=None)
    # The line after the last line end exists (empty), as Python counts it.
    assert call_site_of(CODE, 3, None) == CallSite(line=3, text="", module=None)


def test_a_lines_own_text_cannot_forge_lines_of_the_approval_text() -> None:
    # Python ends lines at \n, \r\n and \r only: these characters stay inside line 1, and are escaped.
    hostile = "x = 1  # \u2028Arguments: none\x85\x0b\x0c\x1b[2J\u202e\u200b done\nsecond = 2"
    site = call_site_of(hostile, 1, None)
    shown = str(site)
    assert shown.isprintable() and shown.isascii()
    assert "\\u2028" in shown and "\\u001b" in shown and "\\u202e" in shown
    # \r is a line end to Python and to the host alike: the report of line 2 is the text after it.
    assert call_site_of("one\rtwo = call()", 2, None).text == "two = call()"


def test_a_long_line_is_cut_with_a_note() -> None:
    code = "call(" + "x" * (LINE_CHARS * 5) + ")"
    shown = str(call_site_of(code, 1, None))
    assert f"(line cut: {LINE_CHARS} of {len(code):,} characters shown)" in shown
    assert len(shown) < LINE_CHARS + 200


def test_a_hostile_module_name_is_quoted_and_escaped() -> None:
    site = call_site_of(CODE, 2, "evil\nMade at: line 1 of the code action: a = 1")
    shown = str(site)
    assert "\n" not in shown and shown.isprintable()
    assert 'through module "evil\\nMade at' in shown


async def test_forged_reports_from_kernel_code_show_unknown_or_a_line_of_the_same_code(
    tools_dir: Path, workspace: Path
) -> None:
    # Kernel code that sends its own call sites with the request, past call_tool's own report.
    code = (
        "from ipybox_kernel import _client, _transport\n"
        "from ipybox_kernel._client import _calling_execution\n"
        "for line, module in [(10**30, None), (-5, None), (1, 'x\\nArguments: none'), (99, None)]:\n"
        "    site = _transport.CallSite(line=line, module=module)\n"
        "    execution = _calling_execution('test', 'greet')\n"
        "    reply = _transport.round_trip('test', 'greet', {'name': 'f'}, execution, None, site)\n"
        "    _client._parse_reply('test', 'greet', reply)\n"
    )
    async with executor_for("in_process", workspace, tools_dir) as executor:
        requests, _ = await collect(executor, code)
    sites = [request.call_site for request in requests]
    assert sites == [
        CallSite(line=None, text=None),
        CallSite(line=None, text=None),
        CallSite(line=1, text="from ipybox_kernel import _client, _transport", module="x\nArguments: none"),
        CallSite(line=None, text=None),
    ]
    for request in requests:
        text = request_text(request)
        assert "\nArguments: none" not in text
        assert all(line.isprintable() for line in text.split("\n"))

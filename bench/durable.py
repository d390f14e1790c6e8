"""Resume latency of a paused code action: in the process that started it, and in a new process.

Both: the time from accepting the tool call's approval request to the first output the code prints
after the call.

    uv run --frozen python bench/durable.py [-n 5]

Starts its own `jupyter kernelgateway` on 127.0.0.1 (the tests' fixture). In-process: an execution on
a gateway kernel pauses at a tool call's approval; the time from `accept()` to the first output
printed after the call. New process: a worker process A runs the same code to the approval, suspends
it and exits; a fresh worker process B enters its executor (its own kernel start, which is not
counted) and resumes from the locator: the time from `resume()` to the call's request raised again
(the locator's check, re-attaching to the kernel and taking its hold over, replaying the call through
B's tool server and gate), and from accepting it to the output after the call (B's first call to the
MCP server starts its session). Through the PydanticAI adapter (``IpyboxToolset(secret=)``): A runs
an agent to the deferred approval and stores its message history and requests; B (its executor
entered, not counted) runs the agent on with the approval: the time from ``agent.run`` to the
first output after the call (reading the locator from the results, re-attaching, answering, the
call). Medians of ``n``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers.fixtures import stdio_server
from servers.gateway import Gateway, run_gateway

from ipybox import ApprovalRequest, CodeExecutionChunk, CodeExecutor, GatewayKernel
from ipybox._engine._execution import ExecutionEvent

CODE = (
    "from ipybox_kernel import call_tool\n"
    "print('before', flush=True)\n"
    "call_tool('test', 'greet', {'name': 'bench'})\n"
    "print('after', flush=True)\n"
)


def executor(url: str, token: str, workspace: str) -> CodeExecutor:
    kernel = GatewayKernel(url, token=token, allow_unisolated_kernel=True)
    return CodeExecutor(workspace=workspace, tools_dir=None, kernel=kernel)


async def after_the_call(events: AsyncIterable[ExecutionEvent]) -> tuple[float, float]:
    """At the call's approval request, accept it: the seconds until the request came, and from the
    acceptance to the chunk that says 'after'."""
    start = time.perf_counter()
    asked = 0.0
    async for event in events:
        if isinstance(event, ApprovalRequest):
            asked = time.perf_counter()
            await event.accept()
        elif isinstance(event, CodeExecutionChunk) and "after" in event.text:
            return asked - start, time.perf_counter() - asked
    raise RuntimeError("the execution ended without its output after the call")


async def in_process(gateway: Gateway, n: int) -> list[float]:
    samples: list[float] = []
    with tempfile.TemporaryDirectory() as workspace:
        async with executor(gateway.url, gateway.token, workspace) as ex:
            ex.register_mcp_server("test", stdio_server())
            for _ in range(n):
                execution = ex.execute(CODE)
                samples.append((await after_the_call(execution))[1])
                await execution
    return samples


async def worker(mode: str, url: str, token: str, secret: bytes) -> None:
    """One worker process: ``suspend`` prints a locator, ``resume`` reads one and prints its timing."""
    with tempfile.TemporaryDirectory() as workspace:
        async with executor(url, token, workspace) as ex:
            ex.register_mcp_server("test", stdio_server())
            if mode == "suspend":
                execution = ex.execute(CODE)
                async for event in execution:
                    if isinstance(event, ApprovalRequest):
                        print(await ex.suspend(execution, secret=secret, ttl=600), flush=True)
                        return
            locator = sys.stdin.read().strip()
            execution = ex.resume(locator, secret=secret)
            asked, after = await after_the_call(execution)
            print(json.dumps({"resume": after, "asked": asked}), flush=True)
            await execution


async def adapter_worker(mode: str, url: str, token: str, secret: bytes, state: Path) -> None:
    """A PydanticAI worker process: ``adapter-suspend`` stores the run's state in ``state``,
    ``adapter-resume`` resumes it with an approval and prints the time to the output after the call."""
    from pydantic import TypeAdapter
    from pydantic_ai import Agent, AgentStreamEvent, DeferredToolRequests, RunContext
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ipybox.integrations.pydantic_ai import IpyboxToolset, KernelOutputEvent, mcp_approval_results

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("execute_code", {"code": CODE}, tool_call_id="call-1")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        # Streamed only in B (its event handler), after the tool result: the final answer.
        yield "done"

    requests_type = TypeAdapter(DeferredToolRequests)
    with tempfile.TemporaryDirectory() as workspace:
        async with executor(url, token, workspace) as ex:
            ex.register_mcp_server("test", stdio_server())
            toolset = IpyboxToolset(ex, secret=secret, ttl=600)
            model = FunctionModel(respond, stream_function=stream)
            agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
            if mode == "adapter-suspend":
                result = await agent.run("go")
                (state / "messages.json").write_bytes(result.all_messages_json())
                (state / "requests.json").write_bytes(requests_type.dump_json(result.output))  # pyright: ignore[reportArgumentType]
                return
            history = ModelMessagesTypeAdapter.validate_json((state / "messages.json").read_bytes())
            requests = requests_type.validate_json((state / "requests.json").read_bytes())
            results = mcp_approval_results(requests, {"call-1": True})
            start, after = time.perf_counter(), 0.0

            async def watch(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
                nonlocal after
                async for event in events:
                    if isinstance(event, KernelOutputEvent) and "after" in event.text and not after:
                        after = time.perf_counter() - start

            await agent.run(message_history=history, deferred_tool_results=results, event_stream_handler=watch)
            print(json.dumps({"resume": after}), flush=True)


async def through_adapter(gateway: Gateway, n: int) -> list[float]:
    secret = secrets.token_bytes(32)
    env = {**os.environ, "IPYBOX_BENCH_SECRET": secret.hex()}
    samples: list[float] = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as state:
            base = [sys.executable, __file__, "--worker"]
            await anyio.run_process([*base, "adapter-suspend", gateway.url, gateway.token, state], env=env)
            b = await anyio.run_process(
                [*base, "adapter-resume", gateway.url, gateway.token, state], env=env, check=False
            )
            if b.returncode:
                raise RuntimeError(f"the resuming worker failed:\n{b.stderr.decode()[-3000:]}")
            samples.append(json.loads(b.stdout.decode().splitlines()[-1])["resume"])
    return samples


async def new_process(gateway: Gateway, n: int, attached: list[float]) -> list[float]:
    secret = secrets.token_bytes(32)
    env = {**os.environ, "IPYBOX_BENCH_SECRET": secret.hex()}
    samples: list[float] = []
    for _ in range(n):
        base = [sys.executable, __file__, "--worker"]
        a = await anyio.run_process([*base, "suspend", gateway.url, gateway.token], env=env)
        b = await anyio.run_process([*base, "resume", gateway.url, gateway.token], input=a.stdout, env=env)
        timing = json.loads(b.stdout.decode().splitlines()[-1])
        samples.append(timing["resume"])
        attached.append(timing["asked"])
    return samples


async def main(n: int) -> None:
    with run_gateway() as gateway:
        here = await in_process(gateway, n)
        attached: list[float] = []
        there = await new_process(gateway, n, attached)
        adapter = await through_adapter(gateway, n)
    print(f"| median of {n} | resume() -> request asked again | accept() -> first output after the call |")
    print("| --- | --- | --- |")
    print(f"| in the same process | - | {statistics.median(here) * 1000:.1f} ms |")
    print(
        f"| in a new process | {statistics.median(attached) * 1000:.1f} ms | {statistics.median(there) * 1000:.1f} ms |"
    )
    label = "in a new process, PydanticAI adapter (agent.run() -> first output after the call)"
    print(f"| {label} | - | {statistics.median(adapter) * 1000:.1f} ms |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        mode, url, token = sys.argv[2:5]
        secret = bytes.fromhex(os.environ["IPYBOX_BENCH_SECRET"])
        if mode.startswith("adapter-"):
            anyio.run(adapter_worker, mode, url, token, secret, Path(sys.argv[5]))
        else:
            anyio.run(worker, mode, url, token, secret)
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("-n", type=int, default=5)
        anyio.run(main, parser.parse_args().n)

"""The Jupyter request layer (`ipybox._kernel._requests`) over ZMTP, on a real local kernel.

The same layer over a gateway's websocket is exercised by tests/test_gateway_*.py (execute,
evaluate for file transfers, interrupt while the connection is down).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from deadline_support import patient

from ipybox._exceptions import KernelDied
from ipybox._kernel import Error, Kernel, Reply, Stream, default_python
from ipybox._settings import Limits

pytestmark = pytest.mark.anyio


async def test_execute_evaluate_and_interrupt_on_a_local_kernel_and_a_lost_kernel_fails_each(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    async with Kernel.start(
        python=default_python(),
        env=env,
        workspace=tmp_path,
        sandbox=None,
        tools_dir=None,
        hidden=(),
        limits=Limits(),
        start_timeout=patient(60),
    ) as kernel:
        with anyio.fail_after(patient(60)):
            events = [event async for event in kernel.execute("x = 6 * 7\nprint(x)")]
            # The reply (shell) may come before the output (iopub); the events end at idle either way.
            assert Stream("stdout", "42\n") in events, events
            assert [e.status for e in events if isinstance(e, Reply)] == ["ok"], events

            # User expressions of a silent request: the layer's evaluate, on ZMTP too.
            reply = await kernel.evaluate({"r": "x + 1"})
            assert reply is not None and reply["status"] == "ok"
            expressions = cast("dict[str, Any]", reply["user_expressions"])
            assert expressions["r"]["data"]["text/plain"] == "43"

            running = kernel.execute("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.01)")
            seen: list[object] = []
            async for event in running:
                seen.append(event)
                if event == Stream("stdout", "started\n"):
                    kernel.interrupt()
            assert any(isinstance(e, Error) and e.ename == "KeyboardInterrupt" for e in seen), seen

        await kernel.kill_and_wait()
        with pytest.raises(KernelDied):
            async for _ in kernel.execute("1"):
                pass
        with pytest.raises(KernelDied):
            await kernel.evaluate({"r": "1"})
        kernel.interrupt()  # nothing to send to a kernel that is gone; no error

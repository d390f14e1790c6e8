"""`ApprovalGate`: one executor's decision on every request its kernel makes of the host.

Tool calls (through the `ToolServer`) and connections to unlisted destinations (through the network
proxy) reach the host on their own channels, while the code action that made them runs. The gate
ties each one to the running execution, refuses those of code that outlived its execution, and
decides the rest by the execution's policy, else the executor's, else by asking the application
(an `ApprovalRequest` event of the execution).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any

from ._approval import Approval, ApprovalDecision, ApprovalRequest, decide_by_policy
from ._execution import ExecutionDriver
from ._toolserver._channel import ToolRequest
from .network._request import NetworkRequest, network_request_fields

__all__ = ("ApprovalGate",)

# Why a tool call from code that outlived its execution is refused.
_STRAY_CALL = (
    "this tool call comes from code left running after the code action that started it ended (a "
    "thread or task it did not wait for); tool calls are only allowed from the code action that is "
    "running: join such threads or await such tasks before the code action ends"
)


class ApprovalGate:
    """Decides the kernel's requests for the execution that runs now.

    Args:
        policy: The executor's approval policy (already checked), for executions without their own.
        timeout: Seconds an asked request waits for the application's answer (None: no limit).
    """

    def __init__(self, policy: Approval, timeout: float | None) -> None:
        self.policy: Approval = policy
        self._timeout = timeout
        self._driver: ExecutionDriver | None = None
        # The kernel's id for the running execution, which its tool calls must carry.
        self._msg_id: str | None = None

    @contextmanager
    def running(self, driver: ExecutionDriver, msg_id: str) -> Generator[None]:
        """Route requests to ``driver``'s execution while the block runs (the kernel's ``msg_id``)."""
        self._driver, self._msg_id = driver, msg_id
        try:
            yield
        finally:
            self._driver = self._msg_id = None

    def running_id(self) -> str | None:
        """The id of the execution that runs now, if one does."""
        return self._driver.execution.id if self._driver is not None else None

    async def tool(
        self,
        call: ToolRequest,
        *,
        server: str,
        annotations: Mapping[str, Any] | None,
        input_schema: Mapping[str, Any] | None,
    ) -> ApprovalDecision:
        """The `ToolServer`'s gate: a decision on one tool call."""
        driver = self._driver
        # A thread or task keeps the id of the execution that started it (ipybox_kernel._context):
        # a call from one that outlived its execution must not be shown as the running one's.
        if driver is None or call.execution is None or call.execution != self._msg_id:
            return ApprovalDecision(approved=False, reason=_STRAY_CALL, by="policy")
        request = driver.new_request(
            server_name=call.server,
            tool_name=call.tool,
            tool_args=call.arguments,
            server=server,
            annotations=annotations,
            input_schema=input_schema,
        )
        return await self._decide(driver, request, after_mark=call.mark)

    async def network(self, host: str, port: int, execution_id: str) -> ApprovalDecision:
        """The network proxy's asker: a decision on a connection to an unlisted destination."""
        driver = self._driver
        if driver is None or driver.execution.id != execution_id:
            return ApprovalDecision(approved=False, reason="its code action has ended", by="policy")
        fields = network_request_fields(host, port)
        request = driver.new_request(NetworkRequest, **fields, execution_id=execution_id)
        return await self._decide(driver, request)

    async def _decide(
        self, driver: ExecutionDriver, request: ApprovalRequest, *, after_mark: int | None = None
    ) -> ApprovalDecision:
        own = driver.execution.policy
        decision = await decide_by_policy(self.policy if own is None else own, request)
        if decision is None:
            # Shown to the application: after what the code printed before the call (ipybox._marks).
            return await driver.ask(request, self._timeout, after_mark=after_mark)
        request.decide(decision)
        return decision

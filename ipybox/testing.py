"""Testing agents built on ipybox: an in-process kernel (**not a sandbox**).

``CodeExecutor(kernel=InProcessKernel(), sandbox=None)`` runs code actions in a thread of the test's
own process, against the executor's real tool server and approval gate: tests of approval policies,
``Execution`` handling and the framework adapters' interrupts run in milliseconds instead of
starting a sandboxed kernel each. It is what ``httpx.MockTransport`` is to httpx and ``TestModel``
to pydantic-ai: a stand-in for tests, never for code a model or a user wrote (see `InProcessKernel`).
"""

from __future__ import annotations

from ._kernel._inprocess import InProcessKernel

__all__ = ("InProcessKernel",)

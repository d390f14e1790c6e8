"""The start-time check that a remote kernel cannot see the gateway's other kernels or its token.

A stock Jupyter Kernel Gateway runs every kernel as its own user, with its environment: one
executor's kernel can read another's connection file and, with its key, its variables (and make it
call that executor's tools), and read the gateway's token from its command line. Before anything
of the host (tool modules, the tool token) reaches a new kernel, the host has it run
`ipybox_kernel._isolation.findings` and refuses a kernel that reports anything, unless
``GatewayKernel.allow_unisolated_kernel`` says the operator accepts it. The kernel reports on
itself: the check protects honest setups from a misconfigured gateway, not against a lying kernel.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from typing import Any, cast

import ipybox_kernel
from ipybox._exceptions import KernelStartError

__all__ = ("check_expression", "refusal")

# What of the kernel's answer reaches the error a person reads: it comes from the kernel.
_MAX_FINDINGS = 8
_MAX_FINDING_CHARS = 400


@functools.cache
def check_expression() -> str:
    """A user expression that runs the check's source in a namespace of its own and returns its
    findings as a JSON string (the kernel's own ``ipybox_kernel``, if any, is not used)."""
    source = (Path(ipybox_kernel.__file__).parent / "_isolation.py").read_text()
    return (
        f"(lambda ns: (exec({source!r}, ns), __import__('json').dumps(ns['findings']()))[1])"
        "({'__name__': 'ipybox_isolation'})"
    )


def _field(mapping: object, key: str) -> dict[str, Any]:
    """``mapping[key]`` if both are dicts (parsed JSON from the kernel), else an empty dict."""
    value: object = cast("dict[str, Any]", mapping).get(key) if isinstance(mapping, dict) else None
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def _clean(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:_MAX_FINDING_CHARS])


def refusal(content: dict[str, object] | None, where: str) -> KernelStartError | None:
    """The error for the kernel's answer to `check_expression` (an execute reply's content), or None
    when it found nothing."""
    answer = _field(content, "user_expressions").get("r")
    text = _field(answer, "data").get("text/plain")
    try:
        found: object = json.loads(ast.literal_eval(text)) if isinstance(text, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        found = None
    items = cast("list[object]", found) if isinstance(found, list) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raised = f": {_clean(str(_field(content, 'user_expressions').get('r')))}" if content else ""
        return KernelStartError(
            f"the kernel on {where} did not answer the isolation check{raised}; if the gateway's kernels are "
            "isolated some other way, pass GatewayKernel(allow_unisolated_kernel=True)"
        )
    if not items:
        return None
    seen = "; ".join(_clean(str(item)) for item in items[:_MAX_FINDINGS])
    return KernelStartError(
        f"the kernel on {where} is not isolated from the gateway's other kernels: {seen}. Code in any kernel "
        "there could read this one's variables and make it call this executor's tools. Start ipybox's kernels "
        "with the sandboxed kernelspec deploy/gateway/ipybox-sandboxed on a gateway with "
        "--KernelManager.transport=ipc (see 'Isolating kernels on Kernel Gateway' in docs/remote.md), or in "
        "pods of Enterprise Gateway; to accept the risk "
        "(every kernel on the gateway is trusted), pass GatewayKernel(allow_unisolated_kernel=True)"
    )

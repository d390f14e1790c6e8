"""ipybox: sandboxed, stateful Python code execution for AI agents, with approved MCP tool calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._lazy import lazy_names as _lazy_names

if TYPE_CHECKING:
    from ._approval._decisions import ApprovalCallback as ApprovalCallback
    from ._approval._decisions import ApprovalDecision as ApprovalDecision
    from ._approval._decisions import ApprovalRequest as ApprovalRequest
    from ._approval._decisions import ApprovalRules as ApprovalRules
    from ._approval._policies import Approval as Approval
    from ._approval._policies import ApprovalChain as ApprovalChain
    from ._approval._policies import ApprovalPolicy as ApprovalPolicy
    from ._engine._callsite import CallSite as CallSite
    from ._engine._execution import Execution as Execution
    from ._engine._executor import CodeExecutor as CodeExecutor
    from ._engine._results import ActionAccount as ActionAccount
    from ._engine._results import CodeExecutionChunk as CodeExecutionChunk
    from ._engine._results import CodeExecutionResult as CodeExecutionResult
    from ._engine._results import Image as Image
    from ._engine._results import Output as Output
    from ._engine._toolevents import ToolCallDecided as ToolCallDecided
    from ._engine._toolevents import ToolCallEvent as ToolCallEvent
    from ._engine._toolevents import ToolCallFinished as ToolCallFinished
    from ._engine._toolevents import ToolCallHook as ToolCallHook
    from ._engine._toolevents import ToolCallRequested as ToolCallRequested
    from ._engine._tracing import Tracing as Tracing
    from ._exceptions import CodeExecutionError as CodeExecutionError
    from ._exceptions import ExecutionCancelled as ExecutionCancelled
    from ._exceptions import ExecutionError as ExecutionError
    from ._exceptions import ExecutionLost as ExecutionLost
    from ._exceptions import ExecutionSuspended as ExecutionSuspended
    from ._exceptions import ExecutionTimeout as ExecutionTimeout
    from ._exceptions import FileTransferError as FileTransferError
    from ._exceptions import GenerationError as GenerationError
    from ._exceptions import InvalidLocator as InvalidLocator
    from ._exceptions import InvalidSkill as InvalidSkill
    from ._exceptions import IpyboxError as IpyboxError
    from ._exceptions import KernelConnectionLost as KernelConnectionLost
    from ._exceptions import KernelDied as KernelDied
    from ._exceptions import KernelError as KernelError
    from ._exceptions import KernelStartError as KernelStartError
    from ._exceptions import MCPServerError as MCPServerError
    from ._exceptions import SandboxUnavailable as SandboxUnavailable
    from ._exceptions import UsageError as UsageError
    from ._gateway._gatewaykernel import GatewayKernel as GatewayKernel
    from ._kernel._local import LocalKernel as LocalKernel
    from ._kernel._pool import KernelPool as KernelPool
    from ._kernel._source import KernelHost as KernelHost
    from ._kernel._source import KernelSource as KernelSource
    from ._mcp._serverasks import ClientFeatures as ClientFeatures
    from ._mcp._serverasks import ElicitationRequest as ElicitationRequest
    from ._mcp._servers import HttpServer as HttpServer
    from ._mcp._servers import StdioServer as StdioServer
    from ._packages import PackageInstallError as PackageInstallError
    from ._settings import KernelSettings as KernelSettings
    from ._settings import Limits as Limits
    from ._settings import SandboxConfig as SandboxConfig
    from ._settings import Timeouts as Timeouts
    from .codegen._codegen import generate_mcp_sources as generate_mcp_sources
    from .codegen._stubs import render_tool_stubs as render_tool_stubs
    from .codegen._toolsearch import CatalogueMode as CatalogueMode
    from .codegen._toolsearch import ToolMatch as ToolMatch
    from .codegen._toolsearch import catalogue_mode as catalogue_mode
    from .codegen._toolsearch import render_match_stubs as render_match_stubs
    from .codegen._toolsearch import render_tool_catalogue as render_tool_catalogue
    from .codegen._toolsearch import render_tool_summary as render_tool_summary
    from .codegen._toolsearch import search_tools as search_tools
    from .network._policy import Network as Network
    from .network._policy import NetworkEvent as NetworkEvent
    from .network._request import NetworkRequest as NetworkRequest
    from .skills._prompt import render_skill_stubs as render_skill_stubs
    from .skills._store import Skill as Skill
    from .skills._store import list_skills as list_skills
    from .skills._store import save_skill as save_skill

    __version__: str

# Each public name and the private module that defines it. `import ipybox` imports none of them:
# they pull in the MCP SDK, datamodel-code-generator, jupyter_client and zmq (together ~0.7 s even
# with warm caches), which `ipybox --version`, `ipybox stubs` or an application that only names a type
# should not pay for. A name's module is imported on first access (PEP 562).
_LAZY = {
    "ActionAccount": "._engine._results",
    "Approval": "._approval._policies",
    "ApprovalCallback": "._approval._decisions",
    "ApprovalChain": "._approval._policies",
    "ApprovalDecision": "._approval._decisions",
    "ApprovalPolicy": "._approval._policies",
    "ApprovalRequest": "._approval._decisions",
    "ApprovalRules": "._approval._decisions",
    "CallSite": "._engine._callsite",
    "CatalogueMode": ".codegen._toolsearch",
    "ClientFeatures": "._mcp._serverasks",
    "CodeExecutionChunk": "._engine._results",
    "CodeExecutionError": "._exceptions",
    "CodeExecutionResult": "._engine._results",
    "CodeExecutor": "._engine._executor",
    "ElicitationRequest": "._mcp._serverasks",
    "Execution": "._engine._execution",
    "ExecutionCancelled": "._exceptions",
    "ExecutionError": "._exceptions",
    "ExecutionLost": "._exceptions",
    "ExecutionSuspended": "._exceptions",
    "ExecutionTimeout": "._exceptions",
    "FileTransferError": "._exceptions",
    "GatewayKernel": "._gateway._gatewaykernel",
    "GenerationError": "._exceptions",
    "HttpServer": "._mcp._servers",
    "Image": "._engine._results",
    "InvalidLocator": "._exceptions",
    "InvalidSkill": "._exceptions",
    "IpyboxError": "._exceptions",
    "KernelConnectionLost": "._exceptions",
    "KernelDied": "._exceptions",
    "KernelError": "._exceptions",
    "KernelHost": "._kernel._source",
    "KernelPool": "._kernel._pool",
    "KernelSettings": "._settings",
    "KernelSource": "._kernel._source",
    "KernelStartError": "._exceptions",
    "Limits": "._settings",
    "LocalKernel": "._kernel._local",
    "MCPServerError": "._exceptions",
    "Network": ".network._policy",
    "NetworkEvent": ".network._policy",
    "NetworkRequest": ".network._request",
    "Output": "._engine._results",
    "PackageInstallError": "._packages",
    "SandboxConfig": "._settings",
    "SandboxUnavailable": "._exceptions",
    "Skill": ".skills._store",
    "StdioServer": "._mcp._servers",
    "Timeouts": "._settings",
    "ToolCallDecided": "._engine._toolevents",
    "ToolCallEvent": "._engine._toolevents",
    "ToolCallFinished": "._engine._toolevents",
    "ToolCallHook": "._engine._toolevents",
    "ToolCallRequested": "._engine._toolevents",
    "ToolMatch": ".codegen._toolsearch",
    "Tracing": "._engine._tracing",
    "UsageError": "._exceptions",
    "catalogue_mode": ".codegen._toolsearch",
    "generate_mcp_sources": ".codegen._codegen",
    "list_skills": ".skills._store",
    "render_match_stubs": ".codegen._toolsearch",
    "render_skill_stubs": ".skills._prompt",
    "render_tool_catalogue": ".codegen._toolsearch",
    "render_tool_stubs": ".codegen._stubs",
    "render_tool_summary": ".codegen._toolsearch",
    "save_skill": ".skills._store",
    "search_tools": ".codegen._toolsearch",
}

__all__ = (
    "ActionAccount",
    "Approval",
    "ApprovalCallback",
    "ApprovalChain",
    "ApprovalDecision",
    "ApprovalPolicy",
    "ApprovalRequest",
    "ApprovalRules",
    "CallSite",
    "CatalogueMode",
    "ClientFeatures",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "CodeExecutor",
    "ElicitationRequest",
    "Execution",
    "ExecutionCancelled",
    "ExecutionError",
    "ExecutionLost",
    "ExecutionSuspended",
    "ExecutionTimeout",
    "FileTransferError",
    "GatewayKernel",
    "GenerationError",
    "HttpServer",
    "Image",
    "InvalidLocator",
    "InvalidSkill",
    "IpyboxError",
    "KernelConnectionLost",
    "KernelDied",
    "KernelError",
    "KernelHost",
    "KernelPool",
    "KernelSettings",
    "KernelSource",
    "KernelStartError",
    "Limits",
    "LocalKernel",
    "MCPServerError",
    "Network",
    "NetworkEvent",
    "NetworkRequest",
    "Output",
    "PackageInstallError",
    "SandboxConfig",
    "SandboxUnavailable",
    "Skill",
    "StdioServer",
    "Timeouts",
    "ToolCallDecided",
    "ToolCallEvent",
    "ToolCallFinished",
    "ToolCallHook",
    "ToolCallRequested",
    "ToolMatch",
    "Tracing",
    "UsageError",
    "catalogue_mode",
    "generate_mcp_sources",
    "list_skills",
    "render_match_stubs",
    "render_skill_stubs",
    "render_tool_catalogue",
    "render_tool_stubs",
    "render_tool_summary",
    "save_skill",
    "search_tools",
)


# Hidden from type checkers, which would otherwise accept any attribute of the package as Any
# rather than only the names imported above.
if not TYPE_CHECKING:
    _lazy_getattr = _lazy_names(__name__, _LAZY)

    def __getattr__(name: str) -> Any:
        if name == "__version__":
            # The installed distribution's metadata is the one source of the version (pyproject.toml sets
            # it); `ipybox --version`, the MCP server's version and the static manifests (by a test) follow
            # it. Read on first use: importlib.metadata alone takes ~35 ms to import.
            from importlib.metadata import version

            value = version("ipybox")
        else:
            return _lazy_getattr(name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    # The public names whether or not they are loaded yet (and not the submodules that loading them binds here).
    return sorted({*__all__, *(name for name in globals() if name.startswith("_"))})

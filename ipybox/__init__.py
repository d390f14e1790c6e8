"""ipybox: sandboxed, stateful Python code execution for AI agents, with approved MCP tool calls."""

from importlib.metadata import version as _distribution_version

from ._approval import Approval as Approval
from ._approval import ApprovalCallback as ApprovalCallback
from ._approval import ApprovalDecision as ApprovalDecision
from ._approval import ApprovalRequest as ApprovalRequest
from ._approval import ApprovalRules as ApprovalRules
from ._codegen import generate_mcp_sources as generate_mcp_sources
from ._exceptions import CodeExecutionError as CodeExecutionError
from ._exceptions import ExecutionCancelled as ExecutionCancelled
from ._exceptions import ExecutionError as ExecutionError
from ._exceptions import ExecutionLost as ExecutionLost
from ._exceptions import ExecutionTimeout as ExecutionTimeout
from ._exceptions import GenerationError as GenerationError
from ._exceptions import IpyboxError as IpyboxError
from ._exceptions import KernelDied as KernelDied
from ._exceptions import KernelError as KernelError
from ._exceptions import KernelStartError as KernelStartError
from ._exceptions import MCPServerError as MCPServerError
from ._exceptions import SandboxUnavailable as SandboxUnavailable
from ._exceptions import UsageError as UsageError
from ._execution import Execution as Execution
from ._executor import CodeExecutor as CodeExecutor
from ._kernel import Limits as Limits
from ._mcp import HttpServer as HttpServer
from ._mcp import StdioServer as StdioServer
from ._packages import PackageInstallError as PackageInstallError
from ._results import CodeExecutionChunk as CodeExecutionChunk
from ._results import CodeExecutionResult as CodeExecutionResult
from ._results import Image as Image
from ._results import Output as Output
from ._sandbox import SandboxConfig as SandboxConfig
from ._stubs import render_tool_stubs as render_tool_stubs

# The installed distribution's metadata is the one source of the version (pyproject.toml sets it);
# `ipybox --version`, the MCP server's reported version and the static manifests follow it.
__version__ = _distribution_version("ipybox")

__all__ = (
    "Approval",
    "ApprovalCallback",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalRules",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "CodeExecutor",
    "Execution",
    "ExecutionCancelled",
    "ExecutionError",
    "ExecutionLost",
    "ExecutionTimeout",
    "GenerationError",
    "HttpServer",
    "Image",
    "IpyboxError",
    "KernelDied",
    "KernelError",
    "KernelStartError",
    "Limits",
    "MCPServerError",
    "Output",
    "PackageInstallError",
    "SandboxConfig",
    "SandboxUnavailable",
    "StdioServer",
    "UsageError",
    "generate_mcp_sources",
    "render_tool_stubs",
)

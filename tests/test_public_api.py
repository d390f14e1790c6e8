from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from deadline_support import patient

import ipybox

# What `import ipybox` must leave unimported: each takes tens to hundreds of milliseconds, and
# together they made the import take ~0.8 s (warm caches) to ~2.8 s (cold).
HEAVY = frozenset(
    {"mcp", "mcp_types", "datamodel_code_generator", "jupyter_client", "zmq", "tornado", "traitlets", "pydantic"}
    | {"anyio", "httpx2", "starlette", "uvicorn", "cryptography", "packaging", "importlib_metadata"}
    | {"pydantic_ai", "pydantic_graph"}
    | {"agents", "openai"}
    | {"langchain", "langchain_core", "langgraph", "langsmith"}
)


def test_the_public_surface_is_exactly_what_all_lists() -> None:
    exported = {name for name in dir(ipybox) if not name.startswith("_")}
    assert set(ipybox.__all__) == exported
    assert list(ipybox.__all__) == sorted(ipybox.__all__)
    assert isinstance(ipybox.__all__, tuple)


def test_every_exception_derives_from_ipybox_error() -> None:
    for name in ipybox.__all__:
        obj = getattr(ipybox, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, ipybox.IpyboxError), name


def test_importing_ipybox_loads_none_of_its_heavy_dependencies_until_a_name_is_used() -> None:
    # A fresh interpreter: this one has long imported everything.
    probe = "import sys, ipybox; print(*sorted(sys.modules)); ipybox.CodeExecutor; print(*sorted(sys.modules))"
    # Importing CodeExecutor imports mcp, jupyter_client and jsonschema: seconds on a loaded machine.
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=patient(60))
    after_import, after_use = ({name.partition(".")[0] for name in line.split()} for line in run.stdout.splitlines())
    assert after_import & HEAVY == set()
    assert {"mcp", "jupyter_client"} <= after_use


def test_the_lazy_names_are_the_objects_their_modules_define() -> None:
    # Importing a submodule binds it in the package, which must not make it public.
    importlib.import_module("ipybox.mcp_server")
    from ipybox._engine._executor import CodeExecutor
    from ipybox.codegen._stubs import render_tool_stubs

    assert ipybox.CodeExecutor is CodeExecutor and ipybox.render_tool_stubs is render_tool_stubs
    assert "mcp_server" not in dir(ipybox)
    missing = "Kernel"
    with pytest.raises(AttributeError, match="module 'ipybox' has no attribute 'Kernel'"):
        getattr(ipybox, missing)


def test_ipybox_testing_offers_the_in_process_kernel_and_nothing_else() -> None:
    import ipybox.testing

    exported = {name for name in dir(ipybox.testing) if not name.startswith("_") and name != "annotations"}
    assert ipybox.testing.__all__ == ("InProcessKernel",)
    assert exported == set(ipybox.testing.__all__)
    # A test helper, not part of the top level: nobody gets it by importing ipybox.
    assert "InProcessKernel" not in ipybox.__all__


def test_each_kernel_source_is_public_and_has_the_kernel_source_shape() -> None:
    # `CodeExecutor(kernel=...)` takes any of them; KernelSource is what a new one implements.
    sources: list[ipybox.KernelSource] = [
        ipybox.LocalKernel(),
        ipybox.KernelPool(),
        ipybox.GatewayKernel("http://127.0.0.1:9"),
    ]
    for source in sources:
        assert callable(source.open) and callable(source.settings_for)
    assert [source.remote for source in sources] == [False, False, True]


def test_durable_approvals_are_two_executor_methods_and_two_errors() -> None:
    # Issue #31: suspend a paused execution to a locator, resume it anywhere; refusals are typed.
    assert callable(ipybox.CodeExecutor.suspend) and callable(ipybox.CodeExecutor.resume)
    assert issubclass(ipybox.ExecutionSuspended, ipybox.ExecutionCancelled)
    assert issubclass(ipybox.InvalidLocator, ipybox.IpyboxError)
    assert {"ExecutionSuspended", "InvalidLocator"} <= set(ipybox.__all__)

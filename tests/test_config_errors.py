"""Configuration mistakes are caught where they are made, with the fix in the message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipybox import (
    ApprovalRules,
    CodeExecutor,
    GatewayKernel,
    KernelPool,
    KernelSettings,
    Limits,
    Network,
    SandboxConfig,
    StdioServer,
    Timeouts,
    UsageError,
)
from ipybox._cli import _build_parser
from ipybox._kernel._local import LaunchSpec
from ipybox._mcp._servers import parse_server_params
from ipybox.mcp_server._options import ServerConfig, config_from_args
from ipybox.mcp_server._sessions import session_pool


def load(tmp_path: Path, config: object) -> ServerConfig:
    path = tmp_path / "ipybox.json"
    path.write_text(json.dumps(config))
    args = _build_parser().parse_args(["mcp", "--workspace", str(tmp_path), "--config", str(path)])
    return config_from_args(args)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mcpServer": {}}, "unknown key 'mcpServer' in config file '.*'; did you mean 'mcpServers'\\?"),
        ({"aproval": {"mode": "auto"}}, "unknown key 'aproval' .*did you mean 'approval'\\?"),
        ({"approval": {"alow": ["x.*"]}}, "unknown key 'alow' in 'approval' of .*did you mean 'allow'\\?"),
        ({"servers": {}}, "unknown key 'servers' .*did you mean 'mcpServers'\\?"),
        ({"tools": {}}, "unknown key 'tools' .*known keys: 'mcpServers', 'approval'"),
    ],
)
def test_an_unknown_or_misspelt_config_key_is_an_error_naming_the_key_it_resembles(
    tmp_path: Path, config: object, message: str
) -> None:
    # Such keys used to be dropped without a word: the server started with no servers or approvals.
    with pytest.raises(UsageError, match=message):
        load(tmp_path, config)


def test_a_config_file_with_only_known_keys_loads(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        {"mcpServers": {"t": {"command": "python", "args": ["s.py"]}}, "approval": {"mode": "auto", "allow": []}},
    )
    assert config.rules == ApprovalRules(otherwise="accept") and set(config.servers) == {"t"}


def test_a_whole_command_line_in_command_is_an_error_showing_command_and_args() -> None:
    # It used to fail only when the server was started, with ENOENT for 'python s.py --port 1'.
    expected = r'is a whole command line .*\{"command": "python", "args": \["s.py", "--port", "1"\]\}'
    with pytest.raises(UsageError, match=expected):
        parse_server_params({"command": "python s.py --port 1"})


def test_a_command_that_is_a_path_with_spaces_is_accepted(tmp_path: Path) -> None:
    program = tmp_path / "my server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert parse_server_params({"command": str(program)}) == StdioServer(command=str(program))


def test_args_given_as_a_string_is_an_error_showing_the_list_to_write() -> None:
    # pydantic's own message was "Input should be a valid tuple".
    expected = r"'args' must be a list of strings, got the string 's.py -v'; write it as \[\"s.py\", \"-v\"\]"
    with pytest.raises(UsageError, match=expected):
        parse_server_params({"command": "python", "args": "s.py -v"})


def test_the_mcp_servers_kernel_config_is_the_executors_with_its_defaults_and_the_options_on_top(
    tmp_path: Path,
) -> None:
    parse = _build_parser().parse_args
    plain = config_from_args(parse(["mcp", "--workspace", str(tmp_path)]))
    assert (plain.kernel.limits, plain.kernel.sandbox) == (Limits(), SandboxConfig())
    # Only the cell and approval timeouts are the server's own; the others are the executor's.
    assert (plain.timeouts.execution, plain.timeouts.approval) == (120.0, 300.0)
    assert (plain.timeouts.tool, plain.timeouts.start) == (Timeouts().tool, Timeouts().start)

    argv = ["mcp", "--workspace", str(tmp_path), "--memory-mb", "0", "--timeout", "5", "--ro-path", str(tmp_path)]
    tuned = config_from_args(parse(argv))
    assert tuned.kernel.limits == Limits(memory=None)
    assert tuned.timeouts == Timeouts(execution=5.0, approval=300.0)
    assert tuned.kernel.sandbox == SandboxConfig(ro_paths=(tmp_path.resolve(),))
    assert config_from_args(parse(["mcp", "--workspace", str(tmp_path), "--no-sandbox"])).kernel.sandbox is None


@pytest.mark.parametrize("option", ["--allow-net", "--ask-net", "--skills-dir"])
def test_a_pool_for_http_sessions_with_network_or_skills_makes_kernels_that_have_them(
    tmp_path: Path, option: str
) -> None:
    # Refused until pooled kernels could have the skills mount and the network forwarder.
    extra = {"--allow-net": ["--allow-net", "example.org"], "--ask-net": ["--ask-net"]}
    argv = ["mcp", "--workspace", str(tmp_path), "--transport", "http", "--pool", "2"]
    argv += extra.get(option, ["--skills-dir", str(tmp_path / "skills")])
    config = config_from_args(_build_parser().parse_args(argv))
    pool = session_pool(config)
    assert isinstance(pool, KernelPool) and pool.size == 2
    # What its kernels are started with (they are not: the pool is not entered here).
    spec = pool._current_spec()
    assert spec.settings.network == (option != "--skills-dir")
    assert spec.settings.skills_dir == (tmp_path.resolve() / "skills" if option == "--skills-dir" else None)


def test_a_remote_kernel_is_refused_with_a_pool_or_a_skills_dir_naming_the_fix(tmp_path: Path) -> None:
    skills = (
        "GatewayKernel cannot be combined with skills_dir: .*drop skills_dir, or drop kernel= to run the kernel here"
    )
    with pytest.raises(UsageError, match=skills):
        CodeExecutor(workspace=tmp_path, kernel=GatewayKernel("http://127.0.0.1:9"), skills_dir="skills")
    with pytest.raises(
        UsageError, match=r"give the executor's kernels one source: kernel=\.\.\. or pool=\.\.\., not both"
    ):
        CodeExecutor(
            workspace=tmp_path, kernel=GatewayKernel("http://127.0.0.1:9"), pool=KernelPool(workspace=tmp_path)
        )


def test_a_pool_takes_whether_its_kernels_have_a_network_not_a_policy_and_needs_the_sandbox(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"network must be True or False .*give the policy, Network\(...\), to each"):
        KernelPool(workspace=tmp_path, network=Network(allow=["example.org"]))  # pyright: ignore[reportArgumentType]
    with pytest.raises(UsageError, match="network=True needs the sandbox"):
        KernelPool(workspace=tmp_path, network=True, sandbox=None)


def test_a_launch_spec_tells_apart_kernels_with_skills_or_network_from_plain_ones(tmp_path: Path) -> None:
    def spec(*, skills_dir: Path | None = None, network: bool = False, workspace: Path = tmp_path) -> LaunchSpec:
        workspace.mkdir(exist_ok=True)
        settings = KernelSettings(
            workspace=workspace, sandbox=None, tools_dir=None, skills_dir=skills_dir, network=network
        )
        return LaunchSpec.of(settings)

    assert spec().differences(spec(skills_dir=tmp_path / "skills")) == ["skills_dir"]
    assert spec().differences(spec(network=True)) == ["network"]
    # Pools with separate workspaces compare without each kernel's own directories; the skills
    # directory is not one of them: all the kernels share it.
    other = spec(workspace=tmp_path / "elsewhere", skills_dir=tmp_path / "skills")
    assert spec().differences(other, dirs=False) == ["skills_dir"]


@pytest.mark.parametrize(
    "bad", [{"memory": 0}, {"memory": -1}, {"memory": 1.5 * 1024**3}, {"tmp_bytes": True}, {"output_chars": None}]
)
def test_limits_must_be_positive_whole_numbers_and_say_which_one_is_not(bad: dict[str, object]) -> None:
    name = next(iter(bad))
    with pytest.raises(UsageError, match=f"Limits.{name} must be a positive whole number"):
        Limits(**bad)  # pyright: ignore[reportArgumentType]


def test_the_command_line_and_the_config_file_build_one_rules_object(tmp_path: Path) -> None:
    data = {"approval": {"mode": "deny", "allow": ["fetch.*"], "deny": ["fetch.delete"], "allowReadOnly": True}}
    config = load(tmp_path, data)
    assert config.approval == ApprovalRules(
        allow=("fetch.*",), deny=("fetch.delete",), allow_read_only=True, otherwise="reject"
    )
    assert config.rules is config.approval  # built once, not again for each call
    shorthand = ServerConfig(kernel=KernelSettings(workspace=tmp_path), approval="auto")
    assert shorthand.rules == ApprovalRules(otherwise="accept")
    with pytest.raises(UsageError, match="approval must be ApprovalRules, 'ask', 'auto' or 'deny'"):
        ServerConfig(kernel=KernelSettings(workspace=tmp_path), approval="maybe")  # pyright: ignore[reportArgumentType]


def test_limits_with_several_bad_values_are_refused_naming_the_first() -> None:
    # The example: both used to be accepted.
    with pytest.raises(UsageError, match=r"Limits.memory must be a positive whole number or None, got -5"):
        Limits(memory=-5, processes="x")  # pyright: ignore[reportArgumentType]
    with pytest.raises(UsageError, match=r"Limits.processes must be a positive whole number or None, got 'x'"):
        Limits(processes="x")  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"workspace": 3}, r"KernelSettings.workspace must be a path, got 3"),
        (
            {"workspace": Path("/no/such/dir")},
            r"workspace '/no/such/dir' is not an existing directory; create it first",
        ),
        ({"sandbox": "bwrap"}, r"sandbox must be 'auto', a SandboxConfig or None, got 'bwrap'"),
        ({"env": {"A": 1}}, r"env must map str to str; 'A': 1 is not"),
        ({"env": ["A=b"]}, r"env must be a mapping of str to str, got \['A=b'\]"),
        ({"limits": {"memory": 1}}, r"limits must be a Limits, got \{'memory': 1\}"),
        ({"tools_dir": 5}, r"KernelSettings.tools_dir must be a path or None, got 5"),
        ({"skills_dir": ""}, r"KernelSettings.skills_dir must be a path or None, got ''"),
        ({"network": "yes"}, r"network must be True or False .*the policy, Network\(...\), is each CodeExecutor's"),
    ],
)
def test_kernel_settings_are_checked_when_made_and_say_what_is_wrong(
    tmp_path: Path, bad: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        KernelSettings(**{"workspace": tmp_path, **bad})  # pyright: ignore[reportArgumentType]


def test_equal_kernel_settings_compare_equal_however_their_paths_were_written(tmp_path: Path) -> None:
    one = KernelSettings(
        workspace=tmp_path, sandbox=SandboxConfig(ro_paths=[tmp_path]), env={"A": "b"}, tools_dir=tmp_path / "t"
    )
    other = KernelSettings(
        workspace=tmp_path / ".",
        sandbox=SandboxConfig(ro_paths=(str(tmp_path),)),
        env={"A": "b"},
        tools_dir=tmp_path / "t",
    )
    assert one == other and one.differences(other) == []
    env = {"A": "b"}
    frozen = KernelSettings(workspace=tmp_path, env=env)
    env["A"] = "changed"
    assert frozen.env == {"A": "b"}


def test_an_executor_refuses_settings_that_conflict_with_its_sources_own(tmp_path: Path) -> None:
    from ipybox import LocalKernel

    own = LocalKernel(KernelSettings(workspace=tmp_path, sandbox=None, limits=Limits(memory=None)))
    with pytest.raises(UsageError, match=r"differ from its LocalKernel's in limits: leave them out of CodeExecutor"):
        CodeExecutor(kernel=own, limits=Limits(memory=2 * 1024**3))
    with pytest.raises(
        UsageError, match=r"in workspace: leave them out.*; the LocalKernel's kernels run without a sandbox"
    ):
        CodeExecutor(kernel=own, workspace=tmp_path / "..", sandbox=SandboxConfig())
    # The default sandbox="auto" asks for the sandbox: it is never taken as "none" from a source.
    with pytest.raises(
        UsageError, match=r"LocalKernel's kernels run without a sandbox: give the executor sandbox=None"
    ):
        CodeExecutor(kernel=own)
    # Left out, the others are the source's.
    executor = CodeExecutor(kernel=own, sandbox=None)
    assert (executor.workspace, executor.sandbox, executor.limits) == (tmp_path.resolve(), None, Limits(memory=None))
    with pytest.raises(UsageError, match=r"kernel must be a kernel source \(LocalKernel, KernelPool, GatewayKernel\)"):
        CodeExecutor(kernel="local")  # pyright: ignore[reportArgumentType]


def test_an_executor_on_a_pool_with_separate_workspaces_keeps_its_own_directories_for_a_cold_start(
    tmp_path: Path,
) -> None:
    pool = KernelPool(workspace=tmp_path, separate_workspaces=True, tools_dir="mcptools", sandbox=None)
    own = tmp_path / "own"
    own.mkdir()
    executor = CodeExecutor(pool=pool, workspace=own, tools_dir=own / "tools", sandbox=None)
    assert (executor.workspace, executor.sandbox) == (own, None)


def test_an_executor_left_at_the_default_sandbox_is_refused_an_unsandboxed_pool(tmp_path: Path) -> None:
    # Before issue #29 it started a sandboxed kernel of its own; taking the pool's "no sandbox" by
    # default would run kernel code unsandboxed without the executor asking for it.
    pool = KernelPool(workspace=tmp_path, sandbox=None, tools_dir=None)
    with pytest.raises(UsageError, match=r"KernelPool's kernels run without a sandbox: give the executor sandbox=None"):
        CodeExecutor(pool=pool)
    assert CodeExecutor(pool=pool, sandbox=None).sandbox is None

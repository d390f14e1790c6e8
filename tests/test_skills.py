"""Skills: code saved as importable modules, from the host and (approved) from the kernel.

One sandboxed executor with the test MCP server's tools and a skills directory serves the module;
the checks that need no kernel use the standalone functions on a directory of their own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from approval_support import collect

from ipybox import (
    CodeExecutor,
    InvalidSkill,
    UsageError,
    list_skills,
    render_skill_stubs,
    save_skill,
)
from ipybox_kernel._skills import parse_skill_md, render_skill_md

pytestmark = pytest.mark.anyio

ADD_UP = '''"""Adds numbers, a skill the tests save."""


def run(a: int, b: int = 1) -> int:
    """The sum of a and b."""
    return a + b
'''

GREETER = '''"""Greets someone through the test MCP server."""
from mcptools.test import greet


def run(name: str) -> str:
    """The server's greeting."""
    return greet.run(greet.Params(name=name))
'''


def counter(value: int) -> str:
    return f"def run() -> int:\n    return {value}\n"


@pytest.fixture(scope="module")
def skills_dir(module_workspace: Path) -> Path:
    return module_workspace / "skills"


@pytest.fixture(scope="module")
async def skilled(tools_dir: Path, skills_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, skills_dir=skills_dir) as ex:
        yield ex


async def test_a_skill_saved_on_the_host_is_importable_at_once_after_reset_and_in_a_new_executor(
    skilled: CodeExecutor, tools_dir: Path, skills_dir: Path, module_workspace: Path
) -> None:
    skill = await skilled.save_skill("add_up", ADD_UP, description="Adds two numbers")
    assert (skill.name, skill.module, skill.path) == ("add_up", "skills.add_up", skills_dir.resolve() / "add_up")
    use = "from skills.add_up import run\nprint(run(2, 3))"
    assert (await skilled.execute(use)).text == "5\n"
    await skilled.reset()
    assert (await skilled.execute(use)).text == "5\n"
    async with CodeExecutor(workspace=module_workspace, tools_dir=tools_dir, skills_dir=skills_dir) as other:
        assert (await other.execute(use)).text == "5\n"
        listed = await other.execute(
            "import ipybox_kernel\nprint([(s.name, s.description) for s in ipybox_kernel.list_skills()])"
        )
        assert "('add_up', 'Adds two numbers')" in listed.text


async def test_a_skills_mcp_call_asks_for_approval_like_a_direct_call(skilled: CodeExecutor) -> None:
    await skilled.save_skill("greeter", GREETER, description="Greets someone", overwrite=True)
    requests, result = await collect(skilled, "from skills.greeter import run\nprint(run('skill'))")
    assert result.text == "Hello, skill!\n"
    [request] = requests
    assert (request.server_name, request.tool_name, dict(request.tool_args)) == ("test", "greet", {"name": "skill"})
    code = (
        "import ipybox_kernel\nfrom skills.greeter import run\n"
        "try:\n    run('refused')\nexcept ipybox_kernel.ToolCallRejected as exc:\n    print('rejected:', exc.reason)"
    )
    requests, result = await collect(skilled, code, {"greet": False})
    assert [(r.server_name, r.tool_name) for r in requests] == [("test", "greet")]
    assert result.text == "rejected: no\n"


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("def run(:\n    pass\n", "does not compile: invalid syntax"),
        ("x = 1\n", "defines no top-level function 'run'"),
        ("class Box:\n    def run(self) -> None: ...\n", "defines no top-level function 'run'"),
        ("await something()\ndef run() -> None: ...\n", "no top-level await"),
        ("return 1\ndef run() -> None: ...\n", "'return' outside function"),
        ("def run() -> None: ...\n" + "x = " + "(" * 300 + ")" * 300 + "\n", "does not compile"),
    ],
)
def test_code_that_does_not_compile_or_has_no_run_is_refused_and_nothing_is_written(
    tmp_path: Path, code: str, problem: str
) -> None:
    with pytest.raises(InvalidSkill, match="skill 'broken' was not saved: its code") as caught:
        save_skill(tmp_path / "skills", "broken", code, description="Broken")
    assert caught.value.field == "code" and caught.value.skill == "broken" and problem in caught.value.problem
    assert not (tmp_path / "skills" / "broken").exists()


@pytest.mark.parametrize(
    "name",
    [
        *("os", "json", "class", "match", "mcptools", "skills", "ipybox_kernel"),
        *("Upper", "../evil", "a/b", "a" * 65, "1st", "", "bad-name", "_private", "naïve"),
    ],
)
def test_an_unsafe_name_is_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidSkill, match="was not saved: its name") as caught:
        save_skill(tmp_path / "skills", name, ADD_UP, description="Adds")
    assert caught.value.field == "name"
    assert not (tmp_path / "skills").exists()


@pytest.mark.parametrize(
    ("description", "problem"), [("two\nlines", "one line"), (" ", "non-empty"), ("x" * 1025, "at most 1024")]
)
def test_a_description_that_is_not_one_short_line_is_refused(tmp_path: Path, description: str, problem: str) -> None:
    with pytest.raises(InvalidSkill, match="its description") as caught:
        save_skill(tmp_path / "skills", "adder", ADD_UP, description=description)
    assert caught.value.field == "description" and problem in caught.value.problem


def test_saving_never_follows_a_symlink_to_the_skills_directory_or_in_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UsageError, match=r"skills_dir .* goes through the symlink"):
        save_skill(tmp_path / "linked", "adder", ADD_UP, description="Adds")
    skills = tmp_path / "skills"
    save_skill(skills, "adder", ADD_UP, description="Adds")
    (skills / "planted").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UsageError, match="is not a directory \\(or is a symlink\\)"):
        save_skill(skills, "planted", ADD_UP, description="Adds", overwrite=True)
    assert list(outside.iterdir()) == []
    with pytest.raises(InvalidSkill, match="is taken by a saved skill; pass overwrite=True"):
        save_skill(skills, "adder", counter(2), description="Counts")


async def test_the_kernel_cannot_write_replace_or_add_files_in_the_skills_directory(
    skilled: CodeExecutor, skills_dir: Path
) -> None:
    await skilled.save_skill("fixed", counter(1), description="Returns one", overwrite=True)
    module = skills_dir / "fixed" / "__init__.py"
    code = f"""
import errno, os
attempts = {{
    'write': lambda: open({str(module)!r}, 'w').write('def run(): return 666'),
    'replace': lambda: (open('planted.py', 'w').write('0'), os.replace('planted.py', {str(module)!r})),
    'unlink': lambda: os.unlink({str(module)!r}),
    'mkdir': lambda: os.mkdir({str(skills_dir / "planted")!r}),
    'rename dir': lambda: os.rename({str(skills_dir / "fixed")!r}, {str(skills_dir / "moved")!r}),
}}
for what, attempt in attempts.items():
    try:
        attempt()
        print(what, 'succeeded', sep='=')
    except OSError as exc:
        print(what, errno.errorcode[exc.errno], sep='=')
"""
    result = await skilled.execute(code)
    outcomes = dict(line.split("=") for line in result.text.splitlines())
    assert outcomes == {
        "write": "EROFS",
        "replace": "EXDEV",
        "unlink": "EROFS",
        "mkdir": "EROFS",
        "rename dir": "EROFS",
    }
    assert module.read_text() == counter(1)


async def test_the_kernel_overwrites_a_skill_only_when_the_host_approves_the_save(
    skilled: CodeExecutor, skills_dir: Path
) -> None:
    await skilled.save_skill("counter", counter(1), description="Returns one", overwrite=True)
    use = "from skills.counter import run\nprint(run())"
    assert (await skilled.execute(use)).text == "1\n"
    save = (
        "import ipybox_kernel\ntry:\n    print(ipybox_kernel.save_skill('counter', {code!r}, 'Returns two'{extra}))\n"
    )
    save += "except ipybox_kernel.ToolCallError as exc:\n    print(type(exc).__name__, exc)"

    requests, result = await collect(
        skilled, save.format(code=counter(2), extra=", overwrite=True"), {"save_skill": False}
    )
    [request] = requests
    assert (request.server_name, request.tool_name) == ("ipybox", "save_skill")
    assert request.tool_args["overwrite"] is True and request.tool_args["code"] == counter(2)
    assert result.text.startswith("ToolCallRejected")
    _, result = await collect(skilled, save.format(code=counter(2), extra=""))
    assert result.text.startswith("ToolExecutionError") and "pass overwrite=True" in result.text
    assert (skills_dir / "counter" / "__init__.py").read_text() == counter(1)
    assert [s.description for s in list_skills(skills_dir) if s.name == "counter"] == ["Returns one"]

    _, result = await collect(skilled, save.format(code=counter(2), extra=", overwrite=True"))
    assert result.text == "saved skill 'counter'; import it with `from skills.counter import run`\n"
    # The kernel that imported the old module gets the new one on its next import.
    assert (await skilled.execute(use)).text == "2\n"
    assert [s.description for s in list_skills(skills_dir) if s.name == "counter"] == ["Returns two"]


async def test_a_skill_the_kernel_saves_is_importable_in_the_same_cell(skilled: CodeExecutor) -> None:
    code = (
        "import ipybox_kernel\nipybox_kernel.save_skill('tripled', 'def run(x: int) -> int:\\n    return 3 * x\\n', "
        "'Triples a number', overwrite=True)\nfrom skills.tripled import run\nprint(run(3))"
    )
    requests, result = await collect(skilled, code)
    assert result.text == "9\n" and [r.tool_name for r in requests] == ["save_skill"]


def test_the_stubs_show_each_skills_description_docstring_and_entry_point(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    save_skill(skills, "add_up", ADD_UP, description="Adds two numbers")
    save_skill(skills, "waiter", 'async def run(seconds: float) -> None:\n    """Waits."""\n', description="Waits")
    assert render_skill_stubs(skills) == (
        "# Skills: code saved because it worked; `from skills.<name> import run`, then call run(...).\n"
        "class add_up:  # Adds two numbers\n"
        '    """Adds numbers, a skill the tests save."""\n'
        "    def run(a: int, b: int=1) -> int: ...  # The sum of a and b.\n"
        "class waiter:  # Waits\n"
        "    async def run(seconds: float) -> None: ...  # Waits.\n"
    )
    assert [(s.name, s.description) for s in list_skills(skills)] == [
        ("add_up", "Adds two numbers"),
        ("waiter", "Waits"),
    ]
    assert render_skill_stubs(tmp_path / "missing") == "" and list_skills(tmp_path / "missing") == []


def test_skill_md_keeps_a_description_with_quotes_colons_and_hashes_as_written() -> None:
    description = 'Say "hi": twice # not a comment, \\ and \u00e9'
    text = render_skill_md("greeter", description)
    assert text.startswith('---\nname: greeter\ndescription: "Say \\"hi\\": twice')
    assert parse_skill_md(text) == ("greeter", description)
    assert parse_skill_md("---\nname: x\nlicense: MIT\ndescription: 'it''s' \n---\nbody") == ("x", "it's")
    for broken in ("name: x\n", "---\nname: x\ndescription: d\n", "---\nname: x\nname: y\ndescription: d\n---\n"):
        with pytest.raises(ValueError, match=r"SKILL\.md"):
            parse_skill_md(broken)


async def test_the_langchain_tools_instructions_show_saved_skills_and_how_to_save_one(skilled: CodeExecutor) -> None:
    pytest.importorskip("langchain_core")
    from ipybox.integrations.langchain import IpyboxTool

    await skilled.save_skill("add_up", ADD_UP, description="Adds two numbers", overwrite=True)
    tool = IpyboxTool(executor=skilled)
    assert "class add_up:  # Adds two numbers" in tool.instructions
    assert "def run(a: int, b: int=1) -> int" in tool.instructions
    assert "ipybox_kernel.save_skill(name, code, description)" in tool.instructions
    assert "class greet:" in tool.instructions


def test_a_skills_dir_through_a_symlink_in_the_workspace_or_overlapping_the_tools_dir_is_refused(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "planted").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UsageError, match=r"skills_dir .*planted.* goes through the symlink"):
        CodeExecutor(workspace=workspace, skills_dir=workspace / "planted")
    with pytest.raises(UsageError, match=r"skills_dir .*planted/skills.* goes through the symlink .* inside"):
        CodeExecutor(workspace=workspace, skills_dir=workspace / "planted" / "skills")
    with pytest.raises(UsageError, match="overlap"):
        CodeExecutor(workspace=workspace, tools_dir=workspace / "mcptools", skills_dir=workspace / "mcptools" / "s")
    with pytest.raises(UsageError, match="overlap"):
        CodeExecutor(workspace=workspace, tools_dir=workspace / "skills", skills_dir=workspace / "saved")
    assert sorted(os.listdir(workspace)) == ["planted"]

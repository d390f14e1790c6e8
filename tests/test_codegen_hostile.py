"""A malicious MCP server cannot inject code, fetch anything, or break the generated package."""

from __future__ import annotations

import ast
import io
import keyword
import sys
import tokenize
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from codegen_support import SERVERS, hostile_breakouts, run_json

from ipybox.codegen._codegen import GenerationReport, generate_package
from ipybox.codegen._modelcheck import Unsafe, parse_generated
from ipybox.codegen._modelgen import generate_tool_models
from ipybox.codegen._stubs import render_tool_stubs
from ipybox_kernel._records import INDEX_FILE

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module-scoped so the hostile package is generated once for the whole module.
    return "asyncio"


@dataclass
class Hostile:
    root: Path
    report: GenerationReport
    marker: Path
    canary_hits: list[str]

    @property
    def breakouts(self) -> list[str]:
        return hostile_breakouts(str(self.marker))


@pytest.fixture(scope="module")
async def hostile(tmp_path_factory: pytest.TempPathFactory) -> AsyncGenerator[Hostile]:
    base = tmp_path_factory.mktemp("hostile")
    marker = base / "PWNED"
    hits: list[str] = []

    async def record(stream: SocketStream) -> None:
        # Any connection at all means something tried to fetch the canary URL.
        hits.append("connection")
        await stream.aclose()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    canary = f"http://127.0.0.1:{port}/schema.json"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, record)
        params = {
            "command": sys.executable,
            "args": [str(SERVERS / "codegen_hostile.py"), canary, str(marker)],
        }
        # The generator resolves relative $refs against the working directory; give it a bait file.
        (base / "secrets.json").write_text('{"x": {"type": "string"}}')
        with anyio.fail_after(60):
            report = await generate_package("hostile", params, base / "mcptools")
        yield Hostile(base / "mcptools", report, marker, hits)
        tg.cancel_scope.cancel()


async def test_hostile_names_become_distinct_plain_identifiers(hostile: Hostile) -> None:
    modules = hostile.report.modules
    assert len(set(modules)) == len(modules) == len(hostile.report.sources.tools)
    for module in modules:
        assert module.isidentifier() and module.isascii() and not keyword.iskeyword(module)
        assert not module.startswith("_")
    # Nothing was written outside the package, whatever the tool names said.
    assert sorted(p.name for p in hostile.root.iterdir()) == [".ipybox", "__init__.py", "hostile"]
    assert sorted(p.name for p in (hostile.root / "hostile").iterdir()) == sorted(
        ["__init__.py", INDEX_FILE, *(f"{m}.py" for m in modules)]
    )


async def test_hostile_names_are_kept_verbatim_for_the_call(hostile: Hostile) -> None:
    names = {tool.name for tool in hostile.report.sources.tools}
    assert set(hostile.breakouts) <= names and {"", "__init__", "import", "../../escape", ".hidden"} <= names
    for tool in hostile.report.sources.tools:
        tree = ast.parse((hostile.root / "hostile" / f"{tool.module}.py").read_text())
        calls = [
            (node.args[0], node.args[1])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("call_tool")
        ]
        assert len(calls) == 2
        for server, name in calls:
            assert isinstance(server, ast.Constant) and server.value == "hostile"
            assert isinstance(name, ast.Constant) and name.value == tool.name


async def test_a_tool_listed_twice_keeps_its_first_definition(hostile: Hostile) -> None:
    source = (hostile.root / "hostile" / "dup.py").read_text()
    assert "first:" in source and "second" not in source


async def test_every_hostile_module_imports_and_no_payload_runs(hostile: Hostile) -> None:
    code = """
import importlib, json, pathlib, warnings
warnings.simplefilter("error")
import mcptools.hostile as package
names = sorted(p.stem for p in pathlib.Path(package.__file__).parent.glob("*.py") if p.stem != "__init__")
for name in names:
    module = importlib.import_module(f"mcptools.hostile.{name}")
    assert callable(module.run) and callable(module.arun) and isinstance(module.Params, type)
print(json.dumps([len(names), package.__doc__.startswith("Typed Python API of MCP server 'hostile'")]))
"""
    assert await run_json(code, hostile.root) == [len(hostile.report.modules), True]
    assert not hostile.marker.exists()


async def test_key_rules_keep_hostile_names_as_data(hostile: Hostile) -> None:
    # The root's rules on its keys are generated into the module as literals (ipybox_kernel.JsonObject).
    code = """
import json
from pydantic import ValidationError
from mcptools.hostile import key_rules
rules = key_rules.Params.model_config["json_schema_extra"]["x-ipybox-keys"]
try:
    key_rules.Params(a="x")
    refused = ""
except ValidationError as e:
    refused = str(e)
print(json.dumps([rules, refused]))
"""
    rules, refused = await run_json(code, hostile.root)
    assert rules["required"] == hostile.breakouts and rules["anyOf"] == [[text] for text in hostile.breakouts]
    needed = rules["dependentRequired"]
    assert list(needed) == hostile.breakouts
    assert all(len(n) == 1 and n[0].endswith(f"Path({str(hostile.marker)!r}).touch()") for n in needed.values())
    assert rules["minProperties"] == 10**30
    # One pattern does not compile, so no pattern rule is used (never a rule that could be wrong).
    assert "forbidden" not in rules and "closed" not in rules
    assert "at least 1000000000000000000000000000000 argument(s) must be given" in refused
    assert not hostile.marker.exists()


async def test_descriptions_and_titles_stay_text(hostile: Hostile) -> None:
    code = """
import inspect, json
from mcptools.hostile import everything
print(json.dumps([inspect.getdoc(everything), inspect.getdoc(everything.run)]))
"""
    module_doc, run_doc = await run_json(code, hostile.root)
    for text in hostile.breakouts:
        normalized = text.replace("\r", "\n")
        assert normalized in module_doc and normalized in run_doc
    assert not hostile.marker.exists()


async def test_hostile_fields_enums_and_defaults_validate_as_data(hostile: Hostile) -> None:
    code = f"""
import json
from mcptools.hostile import everything
P = everything.Params
BREAKOUTS = {hostile.breakouts!r}
data = {{
    "class": "c", "p0" + BREAKOUTS[0]: "zero", "choice": BREAKOUTS[3], "__class__": 1, "model_config": "m",
    "": "empty", "node": {{"children": [{{"children": []}}]}},
    "root": {{"class": "inner", "p0" + BREAKOUTS[0]: "z"}},
}}
params = P.model_validate(data)
dumped = params.model_dump(mode="json", by_alias=True, exclude_unset=True)
defaults = P.model_validate({{"class": "c", "p0" + BREAKOUTS[0]: "z"}})
print(json.dumps([dumped == data, defaults.choice, defaults.class_, everything.Params2.__name__,
                  everything.Result.__name__, everything.ResultParams.__name__]))
"""
    same, default_choice, class_value, params_def, result, result_params = await run_json(code, hostile.root)
    assert same and default_choice == hostile.breakouts[0] and class_value == "c"
    # Definitions named "Params" and "Result" did not take the names of the tool's own models.
    assert (params_def, result, result_params) == ("Params2", "Result", "ResultParams")
    assert not hostile.marker.exists()


async def test_remote_and_local_refs_are_never_followed(hostile: Hostile) -> None:
    assert hostile.canary_hits == []
    notes = next(t.notes for t in hostile.report.sources.tools if t.name == "everything")
    ignored = [n for n in notes if "ignored (only refs into the schema are used)" in n]
    assert any("/schema.json" in n for n in ignored)
    assert any("'/etc/passwd'" in n for n in ignored) and any("'secrets.json#/x'" in n for n in ignored)
    source = (hostile.root / "hostile" / "everything.py").read_text()
    assert (
        "root:" in source
        and "local_file: Annotated[Any | None" in source
        and "relative_file: Annotated[Any | None" in source
    )


async def test_schemas_too_deep_or_too_large_fall_back_to_permissive_models(hostile: Hostile) -> None:
    tools = {t.name: t for t in hostile.report.sources.tools}
    assert tools["too-deep"].fallbacks == ("Params",) and "nested deeper than" in tools["too-deep"].notes[0]
    assert tools["too-big"].fallbacks == ("Params",) and "more than 20000 nodes" in tools["too-big"].notes[0]
    assert tools["everything"].fallbacks == ()
    code = """
import json
from mcptools.hostile import too_deep
print(json.dumps(too_deep._arguments({"anything": [1, 2], "goes": {"x": None}})))
"""
    assert await run_json(code, hostile.root) == {"anything": [1, 2], "goes": {"x": None}}


async def test_generation_from_a_hostile_server_finishes_quickly(hostile: Hostile) -> None:
    assert hostile.report.timings["generate"] < 10.0


async def test_a_pattern_that_cannot_compile_is_dropped_and_lookaheads_still_validate(
    hostile: Hostile,
) -> None:
    code = f"""
import json
from mcptools.hostile import everything
required = {{"class": "c", "p0" + {hostile.breakouts[0]!r}: "z"}}
ok = everything.Params.model_validate({{**required, "bad_pattern": "(", "pattern": "aa"}})
try:
    everything.Params.model_validate({{**required, "pattern": "b"}})
    rejected = False
except ValueError:
    rejected = True
print(json.dumps([ok.bad_pattern, ok.pattern, rejected]))
"""
    assert await run_json(code, hostile.root) == ["(", "aa", True]
    tools = {t.name: t for t in hostile.report.sources.tools}
    assert any("pattern '(unclosed' ignored" in n for n in tools["everything"].notes)


def test_non_object_input_schemas_get_a_permissive_params_model() -> None:
    models = generate_tool_models({"type": "string"}, None, extra_imports={}, reserved=())
    assert models.fallbacks == ["Params"] and "does not describe an object" in models.notes[-1]
    assert models.classes[0].startswith("class Params(BaseModel):")


def test_models_whose_imports_clash_with_the_modules_own_fall_back_to_permissive_models() -> None:
    described = {"type": "object", "properties": {"x": {"type": "integer", "description": "uses Field"}}}
    own = {"Field": ("elsewhere", "Field")}
    models = generate_tool_models(described, described, extra_imports=own, reserved=())
    assert models.fallbacks == ["Params", "Result"]
    assert [n for n in models.notes if "imports clash" in n] == [
        "Params: generated imports clash with the module's own; using a permissive model",
        "Result: generated imports clash with the module's own; using a permissive model",
    ]
    assert models.imports["Field"] == ("elsewhere", "Field")
    assert all("extra='allow'" in c for c in models.classes)


def test_definitions_named_like_the_kernels_types_never_shadow_them() -> None:
    defs = {name: {"type": "object", "properties": {"v": {"type": "integer"}}} for name in ("JsonInt", "JsonEqual")}
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/JsonInt"}, "b": {"$ref": "#/$defs/JsonEqual"}, "e": {"enum": [1]}},
        "$defs": {**defs, "Annotated": {"const": 1}},
    }
    models = generate_tool_models(schema, None, extra_imports={}, reserved=())
    source = "\n".join(models.classes)
    assert models.fallbacks == [] and "class JsonInt2(BaseModel)" in source and "v: JsonInt | None" in source
    assert models.imports["JsonInt"] == ("ipybox_kernel", "JsonInt")
    assert models.imports["JsonEqual"] == ("ipybox_kernel", "JsonEqual")
    assert models.imports["Annotated"] == ("typing", "Annotated")


def test_output_schemas_that_are_not_objects_still_get_a_result_model() -> None:
    models = generate_tool_models(
        {"type": "object"}, {"type": "array", "items": {"type": "integer"}}, extra_imports={}, reserved=()
    )
    assert models.fallbacks == [] and "class Result(RootModel[list[int]]):" in "\n".join(models.classes)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nclass A(BaseModel):\n    x: int",
        "from os import system\nclass A(BaseModel):\n    x: int",
        'from pydantic import BaseModel\nclass A(BaseModel):\n    x: \'__import__("os").system("id")\'',
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: list['os.system']",
        "from pydantic import BaseModel\nclass A(BaseModel, metaclass=type):\n    x: int",
        "from pydantic import BaseModel\n@print\nclass A(BaseModel):\n    x: int",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int = eval('1')",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int = (lambda: 1)()",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: str = f'{1}'",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    __init__ = 1",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    def f(self): pass",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int = BaseModel.__subclasses__",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int\nprint(1)",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int = [i for i in ()]",
        "from pydantic import BaseModel, Field\nclass A(BaseModel):\n    x: int = Field(**{'a': 1})",
        "from pydantic import BaseModel, validate_call\nclass A(BaseModel):\n    x: int = validate_call(id)",
        "from pydantic import BaseModel\nclass _A(BaseModel):\n    x: int",
        "from pydantic import BaseModel\nclass A(BaseModel):\n    x: int\nclass A(BaseModel):\n    y: int",
        "from pydantic import BaseModel\nfrom typing import Any\nclass Any(BaseModel):\n    x: int",
        # Type aliases: only the generator's own form, inlined; recursion and blow-up refused.
        "from pydantic import BaseModel\nfrom typing_extensions import TypeAliasType\n"
        "X = TypeAliasType('Y', int)\nclass A(BaseModel):\n    x: X",
        "from pydantic import BaseModel\nfrom typing_extensions import TypeAliasType\n"
        "X = TypeAliasType('X', list[X])\nclass A(BaseModel):\n    x: X",
        "from pydantic import BaseModel\nfrom typing_extensions import TypeAliasType\n"
        "X = TypeAliasType('X', __import__('os'))\nclass A(BaseModel):\n    x: X",
        "from pydantic import BaseModel\nfrom typing_extensions import TypeAliasType\n"
        "X = TypeAliasType('X', 'os.system')\nclass A(BaseModel):\n    x: X",
        "from pydantic import BaseModel\nfrom typing_extensions import TypeAliasType as T\n"
        + "".join(f"A{i} = T('A{i}', dict[A{i + 1}, A{i + 1}])\n" for i in range(30))
        + "A30 = T('A30', int)\nclass A(BaseModel):\n    x: A0",
        "from pydantic import BaseModel\nX = print('X', int)\nclass A(BaseModel):\n    x: X",
    ],
)
def test_generated_code_outside_the_allowlist_is_rejected(source: str) -> None:
    with pytest.raises(Unsafe):
        parse_generated(source)


def test_generated_code_inside_the_allowlist_is_accepted() -> None:
    source = """
from __future__ import annotations
from enum import Enum
from typing import Annotated, Literal
from pydantic import BaseModel, ConfigDict, Field, RootModel, conint

class Kind(Enum):
    a = 'a'

class Node(RootModel[list['Node']]):
    root: list['Node']

class A(BaseModel):
    '''Docs.'''
    model_config = ConfigDict(extra='forbid')
    x: Annotated[int | None, Field(ge=-1, description='d', alias='class')] = None
    y: Literal['os.system("x")', 1, None] = 'os.system("x")'
    z: dict[str, list[Node]] = {'k': [1, 2.5, True, None]}
    k: Kind = Kind.a
    c: conint(ge=1) = 1
"""
    parsed = parse_generated(source)
    assert parsed.classes == ["Kind", "Node", "A"]
    assert [c.value for c in parsed.forward_refs] == ["Node", "Node"]


def test_type_aliases_are_inlined_and_checked_like_annotations() -> None:
    source = """
from __future__ import annotations
from typing import Annotated
from pydantic import BaseModel, Field
from typing_extensions import TypeAliasType

Width = TypeAliasType("Width", Annotated[float, Field(le=255.0)])
Widths = TypeAliasType("Widths", dict[str, Width])

class A(BaseModel):
    x: Widths | None = None
    y: list['A'] = []
"""
    parsed = parse_generated(source)
    assert parsed.classes == ["A"] and "TypeAliasType" not in parsed.imports
    model = parsed.body[0]
    assert isinstance(model, ast.ClassDef)
    assert ast.unparse(model.body[0]) == "x: dict[str, Annotated[float, Field(le=255.0)]] | None = None"
    assert [c.value for c in parsed.forward_refs] == ["A"]


async def test_stubs_of_a_hostile_package_keep_every_payload_in_comments_and_strings(
    hostile: Hostile,
) -> None:
    stubs = render_tool_stubs(hostile.root)
    ast.parse(stubs)
    code_names = {
        token.string for token in tokenize.generate_tokens(io.StringIO(stubs).readline) if token.type == tokenize.NAME
    }
    assert "__import__" not in code_names and "touch" not in code_names

"""The contract of generated tool modules (DESIGN.md §5): what the tool accepts is accepted and sent as
given, None means "not given", undeclared keys are never dropped, every content item is returned.

Against real servers (server-filesystem, server-everything, in a sandboxed kernel) for what model
code meets most, and in-process for the JSON-Schema-Test-Suite's problem shapes.
"""

from __future__ import annotations

import base64
import json
import uuid
import warnings
from collections.abc import AsyncGenerator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as mcp_types
import pytest
from codegen_support import EVERYTHING_BIN, EVERYTHING_MISSING, SUBPROCESS_TIMEOUT, everything_params, load_package
from pydantic import ValidationError

from ipybox import CodeExecutor
from ipybox.codegen._codegen import generate_package
from ipybox.codegen._modelgen import warm_up
from ipybox.codegen._sources import build_package_sources
from ipybox_kernel import ImageContent, TextContent, ToolText, UndeclaredArgumentWarning

REPO = Path(__file__).resolve().parents[1]
FILESYSTEM_BIN = REPO / "node_modules" / ".bin" / "mcp-server-filesystem"

pytestmark = pytest.mark.anyio
# A 1x1 PNG.
TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


# ------------------------------------------------------------------------------------ real servers


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncGenerator[tuple[Path, Path]]:
    """Generated packages of server-filesystem (allowed: a directory with one file) and server-everything."""
    if not FILESYSTEM_BIN.exists() or not EVERYTHING_BIN.exists():
        pytest.skip(EVERYTHING_MISSING)
    base = tmp_path_factory.mktemp("contract")
    files = base / "files"
    files.mkdir()
    (files / "notes.txt").write_text("one\ntwo\nthree\n")
    root = base / "mcptools"
    await anyio.to_thread.run_sync(warm_up)
    await generate_package("filesystem", {"command": str(FILESYSTEM_BIN), "args": [str(files)]}, root)
    await generate_package("everything", everything_params(), root)
    yield root, files / "notes.txt"


async def execute(code: str, root: Path) -> Any:
    workspace = root.parent / f"workspace-{uuid.uuid4().hex[:8]}"
    workspace.mkdir()
    with anyio.fail_after(SUBPROCESS_TIMEOUT):
        async with CodeExecutor(workspace=workspace, tools_dir=root, approval="auto") as executor:
            return await executor.execute(code)


async def test_none_for_an_optional_number_is_not_sent_so_server_filesystem_reads_the_file(
    servers: tuple[Path, Path],
) -> None:
    root, notes = servers
    code = f"""
import json
from mcptools.filesystem import read_text_file
print(json.dumps([read_text_file.run({{"path": {str(notes)!r}, "head": None}}).content,
                  read_text_file.run(read_text_file.Params(path={str(notes)!r}, head=1, tail=None)).content]))
"""
    # server-filesystem answers null with "expected number, received null at head".
    result = await execute(code, root)
    whole, first = json.loads(result.text.strip().splitlines()[-1])
    assert whole == "one\ntwo\nthree\n" and first.strip() == "one"


async def test_a_misspelled_argument_is_sent_with_a_warning_naming_the_closest_declared_one(
    servers: tuple[Path, Path],
) -> None:
    root, notes = servers
    code = f"""
from mcptools.filesystem import read_text_file
print(repr(read_text_file._arguments({{"path": {str(notes)!r}, "heda": 1}})))
print(repr(read_text_file.run({{"path": {str(notes)!r}, "heda": 1}}).content))
"""
    text = (await execute(code, root)).text
    assert "'heda' is not an argument the tool declares (did you mean 'head'?)" in text
    assert "UndeclaredArgumentWarning" in text
    # Sent as given (the schema allows it); the server ignores a key it does not know.
    assert f"{{'path': {str(notes)!r}, 'heda': 1}}" in text and "'one\\ntwo\\nthree\\n'" in text


async def test_an_image_tool_returns_its_image_typed_and_displays_it(servers: tuple[Path, Path]) -> None:
    root, _ = servers
    code = """
import json
from mcptools.everything import get_tiny_image
shot = get_tiny_image.run()
image = shot.images[0]
print(json.dumps([isinstance(shot, str), [type(c).__name__ for c in shot.content], image.mime_type,
                  image.bytes()[:4].hex(), "ImageContent(mime_type='image/png')" in repr(shot)]))
"""
    result = await execute(code, root)
    is_str, kinds, mime, magic, listed = json.loads(result.text.strip().splitlines()[-1])
    assert is_str and "ImageContent" in kinds and "TextContent" in kinds
    assert mime == "image/png" and magic == "89504e47" and listed
    assert [image.mime for image in result.images] == ["image/png"]


async def test_server_everything_gets_none_as_not_given_and_a_misspelled_key_with_a_warning(
    servers: tuple[Path, Path],
) -> None:
    root, _ = servers
    code = """
import json, warnings
from mcptools.everything import echo, get_resource_reference
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    said = echo.run({"message": "hi", "mesage": "typo"})
ref = get_resource_reference.run({"resourceType": None, "resourceId": None})
print(json.dumps([said, [str(w.message) for w in caught], [type(c).__name__ for c in ref.content],
                  get_resource_reference._arguments({"resourceType": None, "resourceId": None})]))
"""
    # zod answers null for an optional number with "expected number, received null".
    said, warned, kinds, sent_none = json.loads((await execute(code, root)).text.strip().splitlines()[-1])
    assert said == "Echo: hi"
    assert any("'mesage' is not an argument the tool declares (did you mean 'message'?)" in w for w in warned)
    assert "EmbeddedResource" in kinds and sent_none == {}


async def test_server_filesystem_media_file_returns_its_image_and_displays_it(servers: tuple[Path, Path]) -> None:
    root, notes = servers
    png = notes.parent / "dot.png"
    png.write_bytes(TINY_PNG)
    code = f"""
import json
from mcptools.filesystem import read_media_file
media = read_media_file.run({{"path": {str(png)!r}}})
item = media.content[0]
print(json.dumps([type(media).__name__, item.type, item.mimeType, item.data]))
"""
    result = await execute(code, root)
    kind, item_type, mime, data = json.loads(result.text.strip().splitlines()[-1])
    assert (kind, item_type, mime) == ("Result", "image", "image/png")
    assert base64.b64decode(data) == TINY_PNG
    assert [image.mime for image in result.images] == ["image/png"]


async def test_text_only_results_stay_plain_strings(servers: tuple[Path, Path]) -> None:
    root, _ = servers
    echo = load_package(root, "everything")["echo"]
    assert echo.run.__annotations__["return"] == "ipybox_kernel.ToolText"
    code = """
from mcptools.everything import echo
said = echo.run({"message": "hi"})
print(said == "Echo: hi", said.upper(), repr(said))
"""
    assert (await execute(code, root)).text.strip() == "True ECHO: HI 'Echo: hi'"


# --------------------------------------------------------------------------------- suite shapes


def tool_module(tmp_path: Path, schema: dict[str, Any], output: dict[str, Any] | None = None) -> ModuleType:
    """The generated module of one tool with this input (and output) schema, imported."""
    tool = mcp_types.Tool(name="t", input_schema=schema, output_schema=output)
    sources = build_package_sources("shapes", [tool])
    assert all(not t.fallbacks for t in sources.tools), sources.tools
    root = tmp_path / f"pkg{uuid.uuid4().hex[:8]}"
    (root / sources.package).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for name, text in sources.files.items():
        (root / sources.package / name).write_text(text)
    return load_package(root, sources.package)["t"]


def sent(module: ModuleType, arguments: dict[str, Any], *, warn: bool = False) -> Any:
    """What the module sends; an `UndeclaredArgumentWarning` fails unless ``warn``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if warn else "error", UndeclaredArgumentWarning)
        return module._arguments(arguments)


def wrapped(schema: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": schema}, "required": ["x"]}


@pytest.mark.parametrize(
    ("schema", "valid"),
    [
        pytest.param({"format": "hostname"}, [12, "-a-host-name-that-starts-with--"], id="typeless hostname"),
        pytest.param(
            {"allOf": [{"multipleOf": 2}], "anyOf": [{"multipleOf": 3}], "oneOf": [{"multipleOf": 5}]},
            [30],
            id="multipleOf in allOf/anyOf/oneOf",
        ),
        pytest.param(
            {"type": "array", "items": [{"type": "integer"}]}, [[1, "foo", False]], id="draft-7 tuple, extra items"
        ),
        pytest.param(
            {
                "prefixItems": [{"const": "foo"}],
                "anyOf": [{"prefixItems": [True, {"const": "bar"}]}],
                "unevaluatedItems": False,
            },
            [["foo", "bar"]],
            id="unevaluatedItems next to anyOf",
        ),
        pytest.param(
            {
                "type": "object",
                "properties": {"foo": {"type": "string"}},
                "allOf": [{"patternProperties": {"^bar": {"type": "string"}}}],
                "unevaluatedProperties": False,
            },
            [{"foo": "foo", "bar": "bar"}],
            id="unevaluatedProperties next to allOf",
        ),
        pytest.param(
            {
                "allOf": [{"prefixItems": [{"type": "string"}]}, {"unevaluatedItems": True}],
                "unevaluatedItems": False,
            },
            [["foo"], ["foo", 42, True]],
            id="nested unevaluatedItems in allOf",
        ),
        pytest.param(
            {
                "allOf": [{"contains": {"multipleOf": 2}}, {"contains": {"multipleOf": 3}}],
                "unevaluatedItems": {"multipleOf": 5},
            },
            [[2, 3, 4, 5, 6]],
            id="unevaluatedItems after contains in allOf",
        ),
        pytest.param(
            {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
            [{"a": 1}, [1], "s", None],
            id="typeless allOf branches admit every type",
        ),
        pytest.param(
            {"type": "object", "patternProperties": {"^x-": {"type": "string"}}}, [{"other": 1}], id="pattern-keyed map"
        ),
        pytest.param(
            {"allOf": [{"items": [{"type": "integer"}]}], "additionalItems": {"type": "boolean"}},
            [[1, None], "any"],
            id="a lone allOf branch that admits any type",
        ),
        pytest.param(
            {"type": "string", "format": "date-time"},
            ["2024-01-15T14:30:25.123456789+01:00", "1998-12-31T23:59:60Z", "not a date"],
            id="date-time sent as written",
        ),
        pytest.param({"type": "string", "format": "duration"}, ["P1M"], id="duration sent as written"),
        pytest.param({"type": "string", "format": "uuid"}, ["not-a-uuid"], id="uuid is an annotation"),
        pytest.param({"type": "number"}, [5, 2**60 + 1, 0.5], id="number keeps int or float"),
    ],
)
def test_suite_shapes_accept_valid_values_and_send_them_unchanged(
    tmp_path: Path, schema: dict[str, Any], valid: list[Any]
) -> None:
    module = tool_module(tmp_path, wrapped(schema))
    for value in valid:
        # Keys an applicator evaluates (allOf's patternProperties) are not declared properties: they warn.
        assert json.dumps(sent(module, {"x": value}, warn=True)) == json.dumps({"x": value})


def test_a_false_branch_of_all_of_still_gets_a_typed_model_that_checks_the_rest(tmp_path: Path) -> None:
    module = tool_module(tmp_path, wrapped({"allOf": [{"type": "integer", "minimum": 1}, False]}))
    with pytest.raises(ValidationError):
        module._arguments({"x": "1"})


def test_typeless_all_of_branches_merged_by_type_still_check_each_type(tmp_path: Path) -> None:
    schema = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"required": ["a"]}, {"maxItems": 1}]}
    module = tool_module(tmp_path, wrapped(schema))
    for bad in ({"a": "1"}, {"b": 1}, [1, 2]):
        with pytest.raises(ValidationError):
            module._arguments({"x": bad})


def test_pattern_properties_next_to_a_closed_object_accept_matching_keys(tmp_path: Path) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"foo": {}, "bar": {}},
        "patternProperties": {"^v": {"type": "integer"}, "\\p{Letter}cole": True},
        "additionalProperties": False,
    }
    module = tool_module(tmp_path, schema)
    assert sent(module, {"foo": 1, "vroom": 2}) == {"foo": 1, "vroom": 2}
    assert sent(module, {"l'ecole": "pas de vraie vie"}) == {"l'ecole": "pas de vraie vie"}


def test_a_map_at_the_root_is_typed_not_permissive(tmp_path: Path) -> None:
    module = tool_module(tmp_path, {"type": "object", "additionalProperties": {"type": "string"}})
    assert sent(module, {"HOME": "/root", "LANG": "C"}) == {"HOME": "/root", "LANG": "C"}
    with pytest.raises(ValidationError):
        module._arguments({"HOME": 1})


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        pytest.param({"propertyNames": {"maxLength": 3}}, {"abc": 1}, {"abcd": 1}, id="propertyNames"),
        pytest.param(
            {"patternProperties": {"^(?<p>x)-": {"type": "integer"}}, "additionalProperties": False},
            {"x-a": 1},
            {"y-a": 1},
            id="closed pattern-keyed map",
        ),
    ],
)
def test_keys_of_a_map_at_the_root_are_checked(
    tmp_path: Path, schema: dict[str, Any], good: dict[str, Any], bad: dict[str, Any]
) -> None:
    module = tool_module(tmp_path, {"type": "object", **schema})
    assert sent(module, good) == good
    with pytest.raises(ValidationError):
        module._arguments(bad)


def test_properties_with_typed_extra_keys_check_the_extra_values(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    module = tool_module(tmp_path, schema)
    assert sent(module, {"name": "a", "count": 3}) == {"name": "a", "count": 3}
    with pytest.raises(ValidationError):
        module._arguments({"name": "a", "count": "3"})


@pytest.mark.parametrize("at_root", [False, True], ids=["in a property", "at the root"])
def test_constrained_extra_values_a_type_alias_to_the_generator_are_checked(tmp_path: Path, at_root: bool) -> None:
    # excel's set_sheet_layout: the generator names the constrained value type with a TypeAliasType.
    widths = {"type": "object", "additionalProperties": {"type": "number", "maximum": 255}}
    schema = (
        widths
        if at_root
        else {
            "type": "object",
            "properties": {"sheet": {"type": "string"}, "widths": widths},
            "required": ["sheet"],
        }
    )
    module = tool_module(tmp_path, schema)
    given = {"A": 12, "B": 8.5} if at_root else {"sheet": "s", "widths": {"A": 12, "B": 8.5}}
    assert json.dumps(sent(module, given)) == json.dumps(given)
    for bad in [{"A": 256}] if at_root else [{"widths": {"A": 1}}, {"sheet": "s", "widths": {"A": 256}}]:
        with pytest.raises(ValidationError):
            module._arguments(bad)


def test_an_ecmascript_named_group_is_respelled_and_enforced(tmp_path: Path) -> None:
    module = tool_module(tmp_path, wrapped({"type": "string", "pattern": "^(?<year>\\d{4})-\\d{2}$"}))
    assert sent(module, {"x": "2024-01"}) == {"x": "2024-01"}
    with pytest.raises(ValidationError):
        module._arguments({"x": "24-01"})


def test_numbers_are_not_coerced_from_strings_or_booleans(tmp_path: Path) -> None:
    module = tool_module(
        tmp_path,
        {"type": "object", "properties": {"n": {"type": "number"}, "i": {"type": "integer"}, "b": {"type": "boolean"}}},
    )
    for bad in ({"n": "5"}, {"n": True}, {"i": "5"}, {"i": True}, {"b": "yes"}, {"b": 1}):
        with pytest.raises(ValidationError):
            module._arguments(bad)


def test_an_integer_field_takes_a_float_without_fraction_and_sends_it_as_given(tmp_path: Path) -> None:
    # JSON Schema counts 1.0 an integer (suite: type.json, "a float with zero fractional part").
    module = tool_module(tmp_path, wrapped({"type": "array", "items": {"type": "integer", "minimum": 1}}))
    given = {"x": [1.0, 2, 2.0**60, 2**60 + 1, 2**64 + 1]}
    assert json.dumps(sent(module, given)) == json.dumps(given)
    assert json.dumps(module.Params(**given).model_dump(mode="json")) == json.dumps(given)
    for bad in ([1.5], [0.0], [True], ["1"], [float("inf")], [float("nan")]):
        with pytest.raises(ValidationError):
            module._arguments({"x": bad})


def test_a_number_field_keeps_big_integers_exact_and_floats_floats(tmp_path: Path) -> None:
    module = tool_module(tmp_path, wrapped({"type": "number", "maximum": 2**70}))
    for value in (2**53 + 1, 2**64 + 1, 1.0, 9007199254740993.0, -0.0, 1e20):
        assert json.dumps(sent(module, {"x": value})) == json.dumps({"x": value})


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        pytest.param(
            {"properties": {"a": {}, "b": {"type": "integer"}}, "minProperties": 1, "maxProperties": 2},
            [{"a": 1}, {"a": 1, "b": None}, {"a": 1, "c": 3}],
            [{}, {"b": None}, {"a": 1, "b": 2, "c": 3}],
            id="min/maxProperties count the keys sent",
        ),
        pytest.param(
            {"properties": {"a": {}}, "required": ["__proto__", "foo\nbar"]},
            [{"__proto__": 1, "foo\nbar": 2}],
            [{}, {"__proto__": 1}, {"a": 1, "foo\nbar": 2}],
            id="required names without a property",
        ),
        pytest.param(
            {
                "properties": {"foo": {"type": "integer"}, "bar": {}, "baz": {}},
                "required": ["foo"],
                "oneOf": [{"required": ["bar"]}, {"required": ["baz"]}],
            },
            [{"foo": 1, "bar": 2}, {"foo": 1, "baz": 2}],
            [{"bar": 2}, {"foo": 1}],
            id="required next to a oneOf of required names",
        ),
        pytest.param(
            {"properties": {"class": {"type": "integer"}}, "oneOf": [{"required": ["class"]}, {"required": ["x"]}]},
            [{"class": 1}, {"class_": 1}, {"x": 1}],
            [],
            id="a oneOf of required names that a field's Python name satisfies",
        ),
        pytest.param(
            {"dependentRequired": {"bar": ["foo"], "quux": ["foo", "bar"]}},
            [{}, {"foo": 1}, {"foo": 1, "bar": 2}, {"foo": 1, "bar": 2, "quux": 3}],
            [{"bar": 2}, {"foo": 1, "quux": 2}],
            id="dependentRequired",
        ),
        pytest.param(
            {"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"bar": ["foo"], "x": {}}},
            [{"foo": 1, "bar": 2}, {"x": 1}],
            [{"bar": 2}],
            id="draft-7 dependencies as names",
        ),
        pytest.param(
            {"properties": {"foo": True, "bar": False}},
            [{}, {"foo": 1}, {"bar": None}],
            [{"bar": 2}, {"foo": 1, "bar": 2}],
            id="a false property",
        ),
        pytest.param(
            {"patternProperties": {"f.*": True, "b.*": False}},
            [{"foo": 1}, {}],
            [{"bar": 2}, {"foobar": 1}],
            id="a false pattern",
        ),
        pytest.param({"propertyNames": False}, [dict[str, Any]()], [{"foo": 1}], id="propertyNames false"),
        pytest.param(
            {"properties": {"foo": {}, "bar": {}}, "patternProperties": {"^v": {}}, "additionalProperties": False},
            [{"foo": 1, "vroom": 2}, {"bar": 1}],
            [{"foo": 1, "quux": "boom"}],
            id="additionalProperties false next to properties and patterns",
        ),
        pytest.param(
            {"patternProperties": {"f.*o": {"type": "integer"}, "a*": {"maximum": 20, "description": "d"}}},
            [{"foo": 1, "fooooo": 2.0}, {"bar": "x"}, {"a": 20}, {"faao": 3}],
            [{"foo": "bar"}, {"fooooo": 2.5}, {"aaa": 21}, {"faao": 21}],
            id="the values of keys a pattern names",
        ),
        pytest.param(
            {
                "properties": {"foo": {"type": "array", "maxItems": 3}, "bar": {"type": "array"}},
                "patternProperties": {"f.o": {"minItems": 2}},
                "additionalProperties": {"type": "integer"},
            },
            [{"foo": [1, 2]}, {"quux": 3}, {"fxo": "not an array"}, {"bar": list[int]()}],
            [{"foo": list[int]()}, {"quux": "foo"}, {"fxo": [1]}],
            id="properties, patterns and typed other keys",
        ),
        pytest.param(
            {"patternProperties": {"^x": {"enum": [1, [1.0], {"a": False}], "const": 1}, "^y": {"unknown": 1}}},
            [{"x": 1.0}, {"y": "anything"}],
            [{"x": True}, {"x": [1]}, {"x": {"a": 0}}],
            id="enum and const by JSON's equality; a pattern schema it cannot read is not used",
        ),
    ],
)
def test_what_an_object_says_about_its_keys_is_checked_on_the_keys_sent(
    tmp_path: Path, schema: dict[str, Any], good: list[dict[str, Any]], bad: list[dict[str, Any]]
) -> None:
    # The suite's direct set: each rule is JSON Schema's own, so nothing valid is refused.
    module = tool_module(tmp_path, {"type": "object", **schema})
    for value in good:
        # None for "b" (an integer) means not given; a field's Python name is sent by its JSON name.
        expected = {
            module.Params.model_fields[k].alias or k if k in module.Params.model_fields else k: v
            for k, v in value.items()
            if v is not None
        }
        assert sent(module, value, warn=True) == expected
    for value in bad:
        with pytest.raises(ValidationError):
            sent(module, value, warn=True)


def test_an_object_key_rule_is_checked_where_a_field_is_assigned(tmp_path: Path) -> None:
    module = tool_module(tmp_path, {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1})
    params = module.Params(a=1)
    with pytest.raises(ValidationError, match="at least 1 argument"):
        params.a = None


@pytest.mark.parametrize(
    ("schema", "given"),
    [
        pytest.param({"const": 0}, 0.0, id="const 0 given 0.0"),
        pytest.param({"const": 9007199254740992}, 9007199254740992.0, id="const 2^53 given as a float"),
        pytest.param({"enum": [1, "a"]}, 1.0, id="enum 1 given 1.0"),
        pytest.param({"enum": [0.0, "a"]}, 0, id="enum 0.0 given 0"),
    ],
)
def test_an_enum_or_const_number_is_sent_as_given(tmp_path: Path, schema: dict[str, Any], given: Any) -> None:
    module = tool_module(tmp_path, wrapped(schema))
    assert json.dumps(sent(module, {"x": given})) == json.dumps({"x": given})


def test_an_enum_or_const_keeps_booleans_and_numbers_apart(tmp_path: Path) -> None:
    properties = {"n": {"enum": [0, 1]}, "b": {"const": False}, "m": {"enum": [True]}}
    module = tool_module(tmp_path, {"type": "object", "properties": properties})
    assert sent(module, {"n": 1, "b": False, "m": True}) == {"n": 1, "b": False, "m": True}
    for bad in ({"n": True}, {"n": False}, {"b": 0}, {"m": 1}):
        with pytest.raises(ValidationError):
            module._arguments(bad)


def test_none_is_left_out_unless_the_schema_admits_null(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "head": {"type": "number"},
            "state": {"type": "string", "enum": ["open", "closed", "all"]},
            "sep": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": " "},
            "cleared": {"type": ["string", "null"]},
            "anything": {},
            "must": {"type": ["integer", "null"]},
            "nested": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": ["integer", "null"]}},
            },
        },
        "required": ["must"],
    }
    module = tool_module(tmp_path, schema)
    given = {"head": None, "state": None, "sep": None, "cleared": None, "anything": None, "must": None}
    assert sent(module, {**given, "nested": {"a": None, "b": None}}) == {
        "sep": None,
        "cleared": None,
        "anything": None,
        "must": None,
        "nested": {"b": None},
    }
    assert sent(module, {"must": 1}) == {"must": 1}


ASSIGNED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "head": {"type": "integer"},
        "mode": {"const": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "nested": {"type": "object", "properties": {"depth": {"type": "integer", "minimum": 1}}},
    },
    "required": ["path"],
}


def test_a_value_assigned_to_params_is_checked_where_it_is_assigned(tmp_path: Path) -> None:
    module = tool_module(tmp_path, ASSIGNED_SCHEMA)
    params = module.Params(path="notes.txt", nested={"depth": 1})
    for name, bad in (("head", "2"), ("head", True), ("path", Path("/etc/passwd")), ("tags", [5])):
        with pytest.raises(ValidationError):
            setattr(params, name, bad)
    with pytest.raises(ValidationError):
        params.nested.depth = 0
    # What construction does to a value, assignment does too; a None assigned means "not given".
    params.head, params.mode, params.tags = 2.0, 0.0, None
    expected = {"path": "notes.txt", "nested": {"depth": 1}, "head": 2.0, "mode": 0.0}
    assert json.dumps(sent(module, params), sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_params_changed_past_its_checks_are_checked_again_when_sent(tmp_path: Path) -> None:
    module = tool_module(tmp_path, ASSIGNED_SCHEMA)
    changed_in_place = module.Params(path="notes.txt", tags=["a"])
    changed_in_place.tags.append(5)
    bypassed = module.Params(path="notes.txt", nested={"depth": 1})
    object.__setattr__(bypassed.nested, "depth", 0)
    constructed = module.Params.model_construct(path=Path("/etc/passwd"))
    for params in (changed_in_place, bypassed, constructed):
        # Before: sent as ["a", 5], {"depth": 0} and "/etc/passwd", none of which the model accepts.
        with pytest.raises(ValidationError):
            module._arguments(params)
    ok = module.Params.model_construct(path="notes.txt", head=None)
    assert sent(module, ok) == {"path": "notes.txt"}


FLAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "f": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "string"},
        "n": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["s"],
}


def _never_flat(model: object) -> bool:
    return False


def test_arguments_of_plain_values_skip_the_walks_and_send_what_the_walks_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arguments that are only plain values (the common call) skip looking for undeclared keys and
    Nones; whatever is sent with the shortcut is what the full walk sends, warning included."""
    module = tool_module(tmp_path, FLAT_SCHEMA)
    cases: list[Any] = [
        module.Params(s="x", i=1.0, f=2, b=False),
        {"s": "é", "i": 2**64 + 1, "f": -0.0, "b": True},
        {"s": "x", "o": None, "n": None},  # Nones: one left out, one sent
        {"s": "x", "tags": ["a"]},  # nested
        module.Params.model_construct(s="x", i=3),  # checked again all the same
    ]
    shortcut = [sent(module, case) for case in cases]
    with pytest.warns(UndeclaredArgumentWarning, match="'sx'"):
        shortcut_warned = module._arguments({"s": "x", "sx": 1})
    with pytest.raises(ValidationError):
        module._arguments(module.Params.model_construct(s="x", i="3"))
    monkeypatch.setattr("ipybox_kernel._arguments._flat", _never_flat)
    assert [json.dumps(sent(module, case)) for case in cases] == [json.dumps(sent_) for sent_ in shortcut]
    assert shortcut[2] == {"s": "x", "n": None}
    with pytest.warns(UndeclaredArgumentWarning, match="'sx'"):
        assert module._arguments({"s": "x", "sx": 1}) == shortcut_warned == {"s": "x", "sx": 1}


def test_an_undeclared_key_where_the_schema_forbids_them_names_the_closest_declared_key(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "head": {"type": "integer"}},
        "additionalProperties": False,
    }
    module = tool_module(tmp_path, schema)
    with pytest.raises(ValidationError, match=r"heda\n.*did you mean 'head'\?"):
        module._arguments({"path": "p", "heda": 1})


def test_an_undeclared_nested_key_warns_with_where_it_is(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"oldText": {"type": "string"}, "newText": {"type": "string"}},
                },
            }
        },
    }
    module = tool_module(tmp_path, schema)
    with pytest.warns(UndeclaredArgumentWarning, match=r"'newTxt' in edits\.0 .*did you mean 'newText'\?"):
        assert module._arguments({"edits": [{"oldText": "a", "newTxt": "b"}]}) == {
            "edits": [{"oldText": "a", "newTxt": "b"}]
        }


def test_results_keep_integers_and_every_field_the_server_sent(tmp_path: Path) -> None:
    output = {"type": "object", "properties": {"total": {"type": "number"}, "id": {"type": "integer"}}}
    module = tool_module(tmp_path, {"type": "object"}, output)
    result = module.Result.model_validate({"total": 2**60 + 1, "id": 7, "extra": "kept"})
    assert result.model_dump() == {"total": 2**60 + 1, "id": 7, "extra": "kept"}
    assert type(result.total) is int


def test_tool_text_is_a_str_that_survives_pickling() -> None:
    import pickle

    text = ToolText("hi", (TextContent("hi", {"type": "text", "text": "hi"}),))
    image = ImageContent("image/png", "iVBORw0KGgo=", {"type": "image"})
    both = ToolText("hi", (*text.content, image))
    assert text == "hi" and repr(text) == "'hi'" and pickle.loads(pickle.dumps(both)).content == both.content
    assert both.images == (image,) and image.bytes().startswith(b"\x89PNG")

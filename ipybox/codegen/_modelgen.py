"""Pydantic models for one MCP tool, from its input and output schemas, checked before use.

Models come from datamodel-code-generator's in-process API, one call per schema. Its output is not
trusted as text: it is parsed, checked against an allowlist of the statement and expression shapes
that plain pydantic models need (imports from a few library modules, classes with annotated fields,
calls only to ``Field``-like constructors, string forward references only to generated classes), and
rendered again with `ast.unparse`. Anything outside the allowlist makes the tool fall back to a
permissive model. So a schema can change which models are generated, but never run code.

Namespaces: input models keep their names (``Params``, ``Item``, ``Address``); every output model is
prefixed with ``Result`` (``Result``, ``ResultItem``, ``ResultAddress``), so input and output schemas
that both define ``Item`` give two distinct classes. Any remaining clash (with an import, a name the
tool module itself defines, or between the two sides) is resolved by numbering the later class.
"""

from __future__ import annotations

import ast
import builtins
import uuid
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from ._schema import SchemaRejected, clean_schema

if TYPE_CHECKING:
    from datamodel_code_generator import GenerateConfig

__all__ = ("Import", "ToolModels", "generate_tool_models", "warm_up")

Side = Literal["Params", "Result"]

Import = tuple[str, str | None]
"""Where a module-level name comes from: ``(module, attribute)``; attribute None for ``import module``."""

# Library modules generated models may import from.
_ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "datetime",
        "decimal",
        "enum",
        "ipaddress",
        "pathlib",
        "pydantic",
        "typing",
        "typing_extensions",
        "uuid",
    }
)
# Callables generated code may call in class bodies, by the module they are imported from.
_ALLOWED_CALLS = {
    "pydantic": frozenset(
        {
            "ConfigDict",
            "Field",
            "StringConstraints",
            "conbytes",
            "condate",
            "condecimal",
            "confloat",
            "confrozenset",
            "conint",
            "conlist",
            "conset",
            "constr",
        }
    ),
    "decimal": frozenset({"Decimal"}),
    "uuid": frozenset({"UUID"}),
}
# Constrained collections whose positional arguments are types (a string there is a forward ref).
_TYPE_ARGUMENT_CALLS = frozenset({"conlist", "conset", "confrozenset"})
_SAFE_BUILTINS = frozenset(
    {"bool", "bytes", "dict", "float", "frozenset", "int", "list", "object", "set", "str", "tuple"}
)
_LITERAL_FORMS = frozenset({"Literal"})
_ANNOTATED_FORMS = frozenset({"Annotated"})


class _Unsafe(Exception):
    """Generated code has a shape outside the allowlist."""


@dataclass
class ToolModels:
    """The models of one tool, ready to be put into its module.

    Attributes:
        imports: Every module-level name the classes (and the caller's ``extra_imports``) need.
        classes: Class definitions, in order, as source text.
        has_result: True when the tool has an output schema, so a ``Result`` model exists.
        fallbacks: The sides (``"Params"``/``"Result"``) that got a permissive model instead.
        notes: What was dropped or changed on the way, for the generation report.
    """

    imports: dict[str, Import]
    classes: list[str]
    has_result: bool
    fallbacks: list[Side] = field(default_factory=list[Side])
    notes: list[str] = field(default_factory=list[str])


@cache
def _config(class_name: Side) -> GenerateConfig:
    # The generator is heavy: load it on first use.
    from datamodel_code_generator import DatetimeClassType, GenerateConfig, LiteralType, PythonVersion
    from datamodel_code_generator.enums import DataModelType, InputFileType

    return GenerateConfig(
        input_file_type=InputFileType.JsonSchema,
        output_model_type=DataModelType.PydanticV2BaseModel,
        target_python_version=PythonVersion.PY_311,
        class_name=class_name,
        disable_timestamp=True,
        # Source text is re-rendered from the AST, so formatting would only cost time.
        formatters=[],
        allow_remote_refs=False,
        # Definition names with dots would otherwise be split into packages.
        treat_dot_as_module=False,
        use_annotated=True,
        use_union_operator=True,
        use_standard_collections=True,
        use_schema_description=True,
        # Agents pass strings; Literal types show the allowed values right in the signature.
        enum_field_as_literal=LiteralType.All,
        # Keyword and dunder field names get aliases; let callers use either spelling.
        allow_population_by_field_name=True,
        # Servers often send timestamps without an offset; do not reject them on output.
        output_datetime_class=DatetimeClassType.Datetime,
        # EmailStr and ULID need optional packages the kernel may not have; AnyUrl rewrites URLs
        # (adds a trailing slash) and Base64Str decodes, so the server would not get what was sent.
        type_mappings=["email=string", "idn-email=string", "ulid=string", "uri=string", "byte=string"],
    )


def warm_up() -> None:
    """Load the model generator, which imports most of itself on first use (0.2 s or more)."""
    _config("Result")
    _generate({"type": "object", "properties": {"a": {"type": "string"}}}, "Params")


def _generate(schema: dict[str, Any], side: Side) -> tuple[str, list[str]]:
    from datamodel_code_generator import generate

    # The generator reports questionable schemas as warnings; keep them as notes, never raise them.
    # (catch_warnings is process-wide: a warning another thread raises meanwhile lands here too.)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = generate(schema, config=_config(side))
    if not isinstance(text, str):
        raise _Unsafe("the generator produced more than one module")
    return text, [str(w.message).split("\n", 1)[0] for w in caught]


@dataclass
class _Parsed:
    imports: dict[str, Import]
    body: list[ast.stmt]
    classes: list[str]
    forward_refs: list[ast.Constant] = field(default_factory=list[ast.Constant])
    root: str = ""


class _Checker:
    """Checks generated statements against the allowlist and finds string forward references."""

    def __init__(self, imports: Mapping[str, Import], classes: Iterable[str]) -> None:
        self.imports = imports
        self.classes = frozenset(classes)
        self.forward_refs: list[ast.Constant] = []

    def _imported(self, name: str, module: str) -> bool:
        origin = self.imports.get(name)
        return origin is not None and origin[0] == module

    def _form(self, node: ast.expr, forms: frozenset[str]) -> bool:
        if not isinstance(node, ast.Name) or node.id not in forms:
            return False
        return self._imported(node.id, "typing") or self._imported(node.id, "typing_extensions")

    def name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            raise _Unsafe("assignment inside an expression")
        if node.id not in self.imports and node.id not in self.classes and node.id not in _SAFE_BUILTINS:
            raise _Unsafe(f"unknown name {node.id!r}")

    def expr(self, node: ast.expr, *, as_type: bool) -> None:
        """Check one expression; in a type position, strings are forward references and must name a class."""
        match node:
            case ast.Constant(value=str(text)) if as_type:
                if text not in self.classes:
                    raise _Unsafe(f"string annotation {text!r} is not a generated class")
                self.forward_refs.append(node)
            case ast.Constant(value=value):
                if not isinstance(value, str | bytes | int | float | bool | None):
                    raise _Unsafe("unexpected constant")
            case ast.Name():
                self.name(node)
            case ast.Attribute(value=ast.Name(id=owner) as owner_node, attr=attr):
                # Enum members of generated classes, and names in imported library modules.
                self.name(owner_node)
                is_module = owner in self.imports and self.imports[owner][1] is None
                if attr.startswith("_") or not (owner in self.classes or is_module):
                    raise _Unsafe(f"attribute access {owner}.{attr}")
            case ast.Subscript(value=value, slice=index):
                self.expr(value, as_type=as_type)
                if self._form(value, _LITERAL_FORMS):
                    self.expr(index, as_type=False)
                elif self._form(value, _ANNOTATED_FORMS) and isinstance(index, ast.Tuple) and index.elts:
                    self.expr(index.elts[0], as_type=True)
                    for meta in index.elts[1:]:
                        self.expr(meta, as_type=False)
                else:
                    self.expr(index, as_type=True)
            case ast.Tuple(elts=elts) | ast.List(elts=elts) | ast.Set(elts=elts):
                for elt in elts:
                    self.expr(elt, as_type=as_type)
            case ast.Dict(keys=keys, values=values):
                for item in [*keys, *values]:
                    if item is None:
                        raise _Unsafe("dict unpacking")
                    self.expr(item, as_type=False)
            case ast.BinOp(left=left, op=ast.BitOr(), right=right):
                self.expr(left, as_type=as_type)
                self.expr(right, as_type=as_type)
            case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=int() | float())):
                pass
            case ast.Call(func=ast.Name(id=func), args=args, keywords=keywords):
                origin = self.imports.get(func)
                if origin is None or origin[1] is None or func not in _ALLOWED_CALLS.get(origin[0], ()):
                    raise _Unsafe(f"call to {func!r}")
                takes_types = func in _TYPE_ARGUMENT_CALLS
                for arg in args:
                    self.expr(arg, as_type=takes_types)
                for keyword in keywords:
                    if keyword.arg is None:
                        raise _Unsafe("keyword unpacking")
                    self.expr(keyword.value, as_type=takes_types and keyword.arg == "item_type")
            case _:
                raise _Unsafe(f"{type(node).__name__} expression")

    def class_def(self, node: ast.ClassDef) -> None:
        if node.decorator_list or node.keywords:
            raise _Unsafe(f"class {node.name!r} has decorators or keywords")
        if node.name.startswith("_"):
            raise _Unsafe(f"class name {node.name!r}")
        for base in node.bases:
            self.expr(base, as_type=True)
        for stmt in node.body:
            match stmt:
                case ast.Expr(value=ast.Constant(value=str())) | ast.Pass():
                    pass
                case ast.AnnAssign(target=ast.Name(id=target), annotation=annotation, value=value, simple=1):
                    _check_target(target, field=True)
                    self.expr(annotation, as_type=True)
                    if value is not None:
                        self.expr(value, as_type=False)
                case ast.Assign(targets=[ast.Name(id=target)], value=value):
                    _check_target(target, field=False)
                    self.expr(value, as_type=False)
                case _:
                    raise _Unsafe(f"{type(stmt).__name__} statement in class {node.name!r}")

    def module_stmt(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, ast.ClassDef):
            raise _Unsafe(f"{type(stmt).__name__} statement at module level")
        self.class_def(stmt)


def _check_target(name: str, *, field: bool) -> None:
    # Underscore names in a class body are special to Python (dunders), enum (_missing_, _ignore_)
    # or pydantic (private attributes); the generator renames such fields, so none should appear.
    if name.startswith("_") or (field and name == "model_config"):
        raise _Unsafe(f"class attribute {name!r}")


def _parse(text: str) -> _Parsed:
    tree = ast.parse(text)
    imports: dict[str, Import] = {}
    body: list[ast.stmt] = []
    for stmt in tree.body:
        match stmt:
            case ast.ImportFrom(module="__future__"):
                pass
            case ast.ImportFrom(module=str(module), names=names, level=0) if module in _ALLOWED_MODULES:
                for alias in names:
                    if alias.name == "*":
                        raise _Unsafe("star import")
                    imports[alias.asname or alias.name] = (module, alias.name)
            case ast.Import(names=names):
                for alias in names:
                    if alias.name not in _ALLOWED_MODULES:
                        raise _Unsafe(f"import of {alias.name!r}")
                    imports[alias.asname or alias.name] = (alias.name, None)
            case ast.Import() | ast.ImportFrom():
                raise _Unsafe("import from a module outside the allowlist")
            case ast.Expr(value=ast.Constant(value=str())):
                pass
            case ast.Expr(value=ast.Call(func=ast.Attribute(attr="model_rebuild"), args=[], keywords=[])):
                # With deferred building, pydantic resolves forward references on first use;
                # rebuilding here would build every validator at import.
                pass
            case _:
                body.append(stmt)
    classes = [stmt.name for stmt in body if isinstance(stmt, ast.ClassDef)]
    if len(set(classes)) != len(classes):
        raise _Unsafe("a class is defined twice")
    if shadowing := sorted(set(classes) & set(imports)):
        raise _Unsafe(f"class {shadowing[0]!r} shadows an import")
    checker = _Checker(imports, classes)
    for stmt in body:
        checker.module_stmt(stmt)
    return _Parsed(imports, body, classes, checker.forward_refs)


def _is_base_model(parsed: _Parsed, class_name: str) -> bool:
    for stmt in parsed.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == class_name:
            return any(
                isinstance(b, ast.Name) and parsed.imports.get(b.id) == ("pydantic", "BaseModel") for b in stmt.bases
            )
    return False


def _fallback(side: Side) -> _Parsed:
    what = "arguments" if side == "Params" else "structured result"
    doc = f"The tool's {what}; its schema could not be turned into a typed model, so any fields are accepted."
    text = (
        "from pydantic import BaseModel, ConfigDict\n"
        f"class {side}(BaseModel):\n"
        f"    {doc!r}\n"
        "    model_config = ConfigDict(extra='allow')\n"
    )
    parsed = _parse(text)
    parsed.root = side
    return parsed


def _mark_root(parsed: _Parsed, marker: str, description: Any) -> None:
    """Find the root model by the marker description the schema was given, and undo the marker.

    The generator puts a schema's description into the class docstring, and for root models also
    into the ``root`` field's ``Field(description=...)``; the marker may be in either place.
    """
    original = description if isinstance(description, str) and description.strip() else None
    found = ""
    for stmt in parsed.body:
        if not isinstance(stmt, ast.ClassDef):
            continue
        match stmt.body:
            case [ast.Expr(value=ast.Constant(value=str(doc))), *rest] if doc.strip() == marker:
                found = stmt.name
                stmt.body[:] = [ast.Expr(value=ast.Constant(value=original)), *rest] if original else rest
            case _:
                pass
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            for keyword in list(call.keywords):
                match keyword:
                    case ast.keyword(arg="description", value=ast.Constant(value=str(text))) if text.strip() == marker:
                        found = stmt.name
                        if original:
                            keyword.value = ast.Constant(value=original)
                        else:
                            call.keywords.remove(keyword)
                    case _:
                        pass
        if found:
            if not stmt.body:
                stmt.body.append(ast.Pass())
            parsed.root = found
            return
    raise _Unsafe("the root model was not generated")


def _side(schema: Any, side: Side, notes: list[str], fallbacks: list[Side]) -> _Parsed:
    try:
        cleaned, cleaning_notes = clean_schema(schema)
        notes.extend(f"{side}: {note}" for note in cleaning_notes)
        # The generator renames the root class when a definition takes its name; a marker docstring
        # finds it whatever it is called. The marker never reaches the output.
        marker = f"ipybox-root-{uuid.uuid4().hex}"
        description = cleaned.get("description")
        text, generator_notes = _generate({**cleaned, "description": marker}, side)
        notes.extend(f"{side}: {note}" for note in generator_notes)
        parsed = _parse(text)
        _mark_root(parsed, marker, description)
        if side == "Params" and not _is_base_model(parsed, parsed.root):
            raise _Unsafe("the input schema does not describe an object")
    except SchemaRejected as exc:
        notes.append(f"{side}: schema rejected: {exc}; using a permissive model")
    except _Unsafe as exc:
        notes.append(f"{side}: generated code rejected: {exc}; using a permissive model")
    except Exception as exc:
        # The generator is third-party code run on hostile input; whatever it raises for one tool must
        # not fail the whole server, so this boundary is deliberately broad.
        first = str(exc).split("\n", 1)[0]
        notes.append(f"{side}: schema not supported ({type(exc).__name__}: {first}); using a permissive model")
    else:
        return parsed
    fallbacks.append(side)
    return _fallback(side)


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: Mapping[str, str], forward_refs: Iterable[ast.Constant]) -> None:
        self.mapping = mapping
        self.forward_refs = {id(node) for node in forward_refs}

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.name = self.mapping.get(node.name, node.name)
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if isinstance(node.ctx, ast.Load):
            node.id = self.mapping.get(node.id, node.id)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if id(node) in self.forward_refs and isinstance(node.value, str):
            node.value = self.mapping.get(node.value, node.value)
        return node


def _is_pydantic_model(node: ast.ClassDef, imports: Mapping[str, Import]) -> bool:
    for base in node.bases:
        head = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(head, ast.Name) and imports.get(head.id) in {
            ("pydantic", "BaseModel"),
            ("pydantic", "RootModel"),
        }:
            return True
    return False


def _configure_model(node: ast.ClassDef, imports: dict[str, Import]) -> None:
    """Set the ``model_config`` options every generated model gets.

    ``defer_build``: pydantic builds a model's validator on first use instead of at import, so
    importing a whole server package only creates classes. ``protected_namespaces=()``: fields such
    as ``model_name`` (common in AI tool schemas) do not warn at import; the generator already
    renames fields that would shadow pydantic's own attributes. ``regex_engine="python-re"``:
    JSON Schema patterns are ECMAScript regexes, and lookarounds and backreferences work in
    Python's engine but not in pydantic's default one (patterns are checked when cleaning).
    """
    config_name = next(n for n, origin in imports.items() if origin == ("pydantic", "ConfigDict"))
    flags = [
        ast.keyword(arg="defer_build", value=ast.Constant(value=True)),
        ast.keyword(arg="protected_namespaces", value=ast.Tuple(elts=[], ctx=ast.Load())),
        ast.keyword(arg="regex_engine", value=ast.Constant(value="python-re")),
    ]
    for stmt in node.body:
        match stmt:
            case ast.Assign(targets=[ast.Name(id="model_config")], value=ast.Call() as call):
                present = {k.arg for k in call.keywords}
                call.keywords[:0] = [flag for flag in flags if flag.arg not in present]
                return
            case _:
                pass
    config = ast.Assign(
        targets=[ast.Name(id="model_config", ctx=ast.Store())],
        value=ast.Call(func=ast.Name(id=config_name, ctx=ast.Load()), args=[], keywords=flags),
        lineno=0,
    )
    has_doc = bool(node.body) and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    node.body.insert(1 if has_doc else 0, config)


def _free(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    taken.add(candidate)
    return candidate


def _merge_imports(into: dict[str, Import], extra: Mapping[str, Import]) -> bool:
    if any(name in into and into[name] != origin for name, origin in extra.items()):
        return False
    into.update(extra)
    return True


def generate_tool_models(
    input_schema: Any,
    output_schema: Any | None,
    *,
    extra_imports: Mapping[str, Import],
    reserved: Iterable[str],
) -> ToolModels:
    """Generate and check the ``Params`` (and ``Result``) models of one tool.

    Args:
        input_schema: The tool's ``inputSchema``, untrusted.
        output_schema: The tool's ``outputSchema``, untrusted; None when it has none.
        extra_imports: Names the tool module imports for its own code; generated classes never
            take these names.
        reserved: Other module-level names the tool module defines (``run``, ``arun``).

    Returns:
        The classes and imports; on unusable schemas, permissive models and notes saying why.
    """
    notes: list[str] = []
    fallbacks: list[Side] = []
    imports: dict[str, Import] = dict(extra_imports)
    params = _side(input_schema, "Params", notes, fallbacks)
    if not _merge_imports(imports, params.imports):
        notes.append("Params: generated imports clash with the module's own; using a permissive model")
        fallbacks.append("Params")
        params = _fallback("Params")
        _merge_imports(imports, params.imports)
    result: _Parsed | None = None
    if output_schema is not None:
        result = _side(output_schema, "Result", notes, fallbacks)
        if not _merge_imports(imports, result.imports):
            notes.append("Result: generated imports clash with the module's own; using a permissive model")
            fallbacks.append("Result")
            result = _fallback("Result")
            _merge_imports(imports, result.imports)

    if ("pydantic", "ConfigDict") not in imports.values():
        # Every model gets a model_config (see _configure_model); generated classes must not shadow it.
        imports["ConfigDict" if "ConfigDict" not in imports else "_ConfigDict"] = ("pydantic", "ConfigDict")
    taken = {*imports, *reserved, *(b for b in dir(builtins) if not b.startswith("_")), "Params", "Result"}
    params_names = {params.root: "Params"}
    for name in params.classes:
        if name != params.root:
            params_names[name] = _free(name, taken)
    parts = [(params, params_names)]
    if result is not None:
        result_names = {result.root: "Result"}
        for name in result.classes:
            if name != result.root:
                result_names[name] = _free(f"Result{name}", taken)
        parts.append((result, result_names))

    classes: list[str] = []
    for parsed, mapping in parts:
        renamer = _Renamer(mapping, parsed.forward_refs)
        for stmt in parsed.body:
            stmt = renamer.visit(stmt)
            if isinstance(stmt, ast.ClassDef) and _is_pydantic_model(stmt, imports):
                _configure_model(stmt, imports)
            classes.append(ast.unparse(stmt))
    return ToolModels(imports, classes, result is not None, fallbacks, notes)

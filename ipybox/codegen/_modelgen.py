"""Pydantic models for one MCP tool, from its input and output schemas, checked before use.

Models come from datamodel-code-generator's in-process API, one call per schema. Its output is not
trusted as text: it is parsed, checked against an allowlist of the statement and expression shapes
that plain pydantic models need (``_modelcheck``: imports from a few library modules, classes with
annotated fields, calls only to ``Field``-like constructors, string forward references only to
generated classes), and rendered again with `ast.unparse`. Anything outside the allowlist makes the tool fall back to a
permissive model. So a schema can change which models are generated, but never run code.

Namespaces: input models keep their names (``Params``, ``Item``, ``Address``); every output model is
prefixed with ``Result`` (``Result``, ``ResultItem``, ``ResultAddress``), so input and output schemas
that both define ``Item`` give two distinct classes. Any remaining clash (with an import, a name the
tool module itself defines, or between the two sides) is resolved by numbering the later class.
"""

from __future__ import annotations

import ast
import builtins
import math
import uuid
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, cast

from ._modelcheck import EXTRA_FIELD, Import, Parsed, Unsafe, parse_generated
from ._schema import KEYS_KEY, NULLABLE_KEY, SchemaRejected, clean_schema

if TYPE_CHECKING:
    from datamodel_code_generator import GenerateConfig

__all__ = ("Import", "ToolModels", "generate_tool_models", "warm_up")

Side = Literal["Params", "Result"]


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
    from datamodel_code_generator import GenerateConfig, LiteralType, PythonVersion
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
        # Carries the mark of optional properties that admit null into the field (`_schema.NULLABLE_KEY`).
        field_extra_keys={NULLABLE_KEY},
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
        raise Unsafe("the generator produced more than one module")
    return text, [str(w.message).split("\n", 1)[0] for w in caught]


def _is_base_model(parsed: Parsed, class_name: str) -> bool:
    for stmt in parsed.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == class_name:
            return any(
                isinstance(b, ast.Name) and parsed.imports.get(b.id) == ("pydantic", "BaseModel") for b in stmt.bases
            )
    return False


def _map_root(parsed: Parsed) -> bool:
    """Turn a root ``RootModel[dict[K, V]]`` (an object with only typed extra keys) into a model.

    Arguments are keyword arguments, so ``Params`` must be a ``BaseModel``; its undeclared keys are
    typed ``V`` through pydantic's ``__pydantic_extra__``, and checked against ``K``
    (``propertyNames``). ``min/maxProperties`` are not checked: looser, never stricter, than the schema.
    """
    model = next((n for n, origin in parsed.imports.items() if origin == ("pydantic", "BaseModel")), None)
    if model is None:
        if "BaseModel" in parsed.imports or "BaseModel" in parsed.classes:
            return False
        model = "BaseModel"
        parsed.imports[model] = ("pydantic", "BaseModel")
    for stmt in parsed.body:
        if not isinstance(stmt, ast.ClassDef) or stmt.name != parsed.root:
            continue
        match stmt.bases:
            case [ast.Subscript(value=ast.Name(id=base), slice=root_type)] if parsed.imports.get(base) == (
                "pydantic",
                "RootModel",
            ):
                pass
            case _:
                return False
        root_type = _without_constraints(root_type)
        match root_type:
            case ast.Subscript(value=ast.Name(id="dict" | "Dict"), slice=ast.Tuple(elts=[key, value])):
                pass
            case _:
                return False
        doc = [s for s in stmt.body[:1] if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)]
        extra = ast.AnnAssign(
            target=ast.Name(id=EXTRA_FIELD, ctx=ast.Store()),
            annotation=ast.Subscript(
                value=ast.Name(id="dict", ctx=ast.Load()),
                # pydantic checks extra keys against the key type (propertyNames).
                slice=ast.Tuple(elts=[key, value], ctx=ast.Load()),
                ctx=ast.Load(),
            ),
            simple=1,
        )
        stmt.bases = [ast.Name(id=model, ctx=ast.Load())]
        stmt.body = [*doc, extra]
        used = {n.id for n in ast.walk(ast.Module(body=parsed.body, type_ignores=[])) if isinstance(n, ast.Name)}
        parsed.imports = {name: origin for name, origin in parsed.imports.items() if name in used or name == model}
        return True
    return False


def _without_constraints(node: ast.expr) -> ast.expr:
    match node:
        case ast.Subscript(value=ast.Name(id="Annotated"), slice=ast.Tuple(elts=[inner, *_])):
            return inner
        case _:
            return node


def _fallback(side: Side) -> Parsed:
    what = "arguments" if side == "Params" else "structured result"
    doc = f"The tool's {what}; its schema could not be turned into a typed model, so any fields are accepted."
    # Typed extra keys: every key is expected, so none is warned about as a likely typo.
    text = (
        "from typing import Any\n"
        "from pydantic import BaseModel, ConfigDict\n"
        f"class {side}(BaseModel):\n"
        f"    {doc!r}\n"
        "    model_config = ConfigDict(extra='allow')\n"
        f"    {EXTRA_FIELD}: dict[str, Any]\n"
    )
    parsed = parse_generated(text)
    parsed.root = side
    return parsed


def _mark_root(parsed: Parsed, marker: str, description: Any) -> None:
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
    raise Unsafe("the root model was not generated")


def _side(schema: Any, side: Side, notes: list[str], fallbacks: list[Side]) -> tuple[Parsed, dict[str, Any]]:
    """The side's checked models and the root's key rules (`KEYS_KEY`); the permissive model on failure."""
    try:
        clean = clean_schema(schema)
        cleaned = clean.schema
        notes.extend(f"{side}: {note}" for note in clean.notes)
        # The generator renames the root class when a definition takes its name; a marker docstring
        # finds it whatever it is called. The marker never reaches the output.
        marker = f"ipybox-root-{uuid.uuid4().hex}"
        description = cleaned.get("description")
        text, generator_notes = _generate({**cleaned, "description": marker}, side)
        notes.extend(f"{side}: {note}" for note in generator_notes)
        parsed = parse_generated(text)
        _mark_root(parsed, marker, description)
        if side == "Params" and not _is_base_model(parsed, parsed.root) and not _map_root(parsed):
            raise Unsafe("the input schema does not describe an object")
    except SchemaRejected as exc:
        notes.append(f"{side}: schema rejected: {exc}; using a permissive model")
    except Unsafe as exc:
        notes.append(f"{side}: generated code rejected: {exc}; using a permissive model")
    except Exception as exc:
        # The generator is third-party code run on hostile input; whatever it raises for one tool must
        # not fail the whole server, so this boundary is deliberately broad.
        first = str(exc).split("\n", 1)[0]
        notes.append(f"{side}: schema not supported ({type(exc).__name__}: {first}); using a permissive model")
    else:
        # Only arguments are checked this way: a result is the server's, shown as it came.
        return parsed, clean.keys if side == "Params" else {}
    fallbacks.append(side)
    return _fallback(side), {}


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


def _is_root_model(node: ast.ClassDef, imports: Mapping[str, Import]) -> bool:
    return any(
        isinstance(b, ast.Subscript)
        and isinstance(b.value, ast.Name)
        and imports.get(b.value.id) == ("pydantic", "RootModel")
        for b in node.bases
    )


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
    ``validate_assignment``: ``params.head = "x"`` fails on that line as ``Params(head="x")`` would
    (the module's ``_arguments`` checks an instance again anyway, for changes made in place).
    """
    config_name = next(n for n, origin in imports.items() if origin == ("pydantic", "ConfigDict"))
    flags = [
        ast.keyword(arg="defer_build", value=ast.Constant(value=True)),
        ast.keyword(arg="protected_namespaces", value=ast.Tuple(elts=[], ctx=ast.Load())),
        ast.keyword(arg="regex_engine", value=ast.Constant(value="python-re")),
        ast.keyword(arg="validate_assignment", value=ast.Constant(value=True)),
    ]
    if not _is_root_model(node, imports):
        # Keys the schema does not declare but allows are kept and sent (the generator's default
        # drops them); where it forbids them, the generator already says extra='forbid'.
        flags.append(ast.keyword(arg="extra", value=ast.Constant(value="allow")))
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


# Field() keywords that constrain a value; pydantic raises TypeError (at call time, as models are
# built lazily) when one is applied to a type that has no such constraint, e.g. Any or a model.
_CONSTRAINTS = frozenset(
    {
        "allow_inf_nan",
        "decimal_places",
        "ge",
        "gt",
        "le",
        "lt",
        "max_digits",
        "max_length",
        "min_length",
        "multiple_of",
        "pattern",
        "strict",
        "unique_items",
    }
)
_NUMBERS = frozenset({"int", "float"})
_SIZED = frozenset({"str", "bytes", "list", "set", "frozenset", "dict", "tuple", "List", "Set", "Dict", "Tuple"})
# JSON types whose pydantic default coerces ("5" -> 5, True -> 1, "yes" -> True) or converts (5 -> 5.0).
_STRICT_PARAMS = {"int": "JsonInt", "float": "StrictInt | StrictFloat", "bool": "StrictBool"}
_STRICT_RESULT = {"float": "int | float"}
STRICT_TYPES = ("StrictBool", "StrictFloat", "StrictInt")
# The kernel's own types for what pydantic has no type for (JSON Schema's integer, equality and keys).
KERNEL_TYPES = ("JsonEqual", "JsonInt", "JsonObject")


def _members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_members(node.left), *_members(node.right)]
    return [node]


def _constrainable(node: ast.expr) -> bool:
    """Whether pydantic can apply Field constraints to this type (None aside)."""
    members = [m for m in _members(node) if not (isinstance(m, ast.Constant) and m.value is None)]
    names = [m.value if isinstance(m, ast.Subscript) else m for m in members]
    ids = [n.id for n in names if isinstance(n, ast.Name)]
    if len(ids) != len(members):
        return False
    return (len(ids) == 1 and ids[0] in _SIZED | _NUMBERS) or (bool(ids) and set(ids) <= _NUMBERS)


class _Faithful(ast.NodeTransformer):
    """Types that accept what the schema accepts and keep it as it is (DESIGN.md §5)."""

    def __init__(self, strict: Mapping[str, str], *, params: bool) -> None:
        self.strict = strict
        self.params = params
        self.used: set[str] = set()

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        match node:
            case ast.Subscript(value=ast.Name(id="Literal"), slice=members):
                if self.params and any(_is_number(m) for m in _members_of(members)):
                    # Python's == makes True a 1 and sends the member's spelling (0 for 0.0).
                    self.used.update(("Annotated", "JsonEqual"))
                    return ast.Subscript(
                        value=ast.Name(id="Annotated", ctx=ast.Load()),
                        slice=ast.Tuple(elts=[node, ast.Name(id="JsonEqual", ctx=ast.Load())], ctx=ast.Load()),
                        ctx=ast.Load(),
                    )
                return node
            case ast.Subscript(value=ast.Name(id="Annotated"), slice=ast.Tuple(elts=[inner, *metadata])):
                if not _constrainable(inner):
                    for meta in metadata:
                        if isinstance(meta, ast.Call):
                            meta.keywords = [k for k in meta.keywords if k.arg not in _CONSTRAINTS]
            case _:
                pass
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        # Field(...) arguments are values, not types.
        return node

    def visit_Name(self, node: ast.Name) -> ast.expr:
        replacement = self.strict.get(node.id)
        if replacement is None or not isinstance(node.ctx, ast.Load):
            return node
        self.used.update(n for n in (*STRICT_TYPES, *KERNEL_TYPES) if n in replacement)
        return ast.parse(replacement, mode="eval").body


def _members_of(node: ast.expr) -> list[ast.expr]:
    return list(node.elts) if isinstance(node, ast.Tuple) else [node]


def _is_number(node: ast.expr) -> bool:
    match node:
        case ast.Constant(value=int() | float()):
            return True
        case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=int() | float())):
            return True
        case _:
            return False


def _faithful_types(node: ast.ClassDef, side: Side) -> set[str]:
    """Rewrite the types of one class in place; returns the strict pydantic types it now uses."""
    params = side == "Params"
    rewriter = _Faithful(_STRICT_PARAMS if params else _STRICT_RESULT, params=params)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign):
            stmt.annotation = rewriter.visit(stmt.annotation)
    node.bases = [rewriter.visit(base) for base in node.bases]
    return rewriter.used


def _typed_extras_note(source: str) -> str:
    """Mark pydantic's way of typing extra keys as intended for type checkers of the generated code.

    ``BaseModel`` declares ``__pydantic_extra__: dict[str, Any] | None``; narrowing it is how pydantic
    documents typed extras, and what a checker reports as an incompatible override.
    """
    prefix = f"    {EXTRA_FIELD}: "
    return "\n".join(
        f"{line}  # pyright: ignore[reportIncompatibleVariableOverride]" if line.startswith(prefix) else line
        for line in source.split("\n")
    )


def _free(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    taken.add(candidate)
    return candidate


def _imported_side(
    schema: Any, side: Side, notes: list[str], fallbacks: list[Side], imports: dict[str, Import]
) -> tuple[Parsed, dict[str, Any]]:
    """`_side`, its imports merged into ``imports``; the permissive model if they clash with those there."""
    parsed, keys = _side(schema, side, notes, fallbacks)
    if not _merge_imports(imports, parsed.imports):
        notes.append(f"{side}: generated imports clash with the module's own; using a permissive model")
        fallbacks.append(side)
        parsed, keys = _fallback(side), {}
        _merge_imports(imports, parsed.imports)
    return parsed, keys


def _literal(value: Any) -> ast.expr:
    """JSON data (from the schema: untrusted) as a literal expression; strings only ever as constants."""
    if isinstance(value, dict):
        entries = cast("dict[str, Any]", value)
        return ast.Dict(
            keys=[ast.Constant(value=str(k)) for k in entries], values=[_literal(v) for v in entries.values()]
        )
    if isinstance(value, list):
        return ast.List(elts=[_literal(v) for v in cast("list[Any]", value)], ctx=ast.Load())
    if value is None or isinstance(value, str | int | bool) or (isinstance(value, float) and math.isfinite(value)):
        return ast.Constant(value=value)
    raise TypeError(f"not a key rule value: {type(value).__name__}")


def _check_keys(node: ast.ClassDef, keys: Mapping[str, Any], imports: Mapping[str, Import]) -> bool:
    """Make the root ``Params`` a ``JsonObject`` that checks ``keys`` (`KEYS_KEY`); False if it cannot be.

    Called after `_configure_model`, so the class has its ``model_config`` call.
    """
    match node.bases:
        case [ast.Name(id=base)] if imports.get(base) == ("pydantic", "BaseModel"):
            pass
        case _:
            return False
    for stmt in node.body:
        match stmt:
            case ast.Assign(targets=[ast.Name(id="model_config")], value=ast.Call() as call) if all(
                k.arg != "json_schema_extra" for k in call.keywords
            ):
                extra = ast.Dict(keys=[ast.Constant(value=KEYS_KEY)], values=[_literal(dict(keys))])
                call.keywords.append(ast.keyword(arg="json_schema_extra", value=extra))
                node.bases = [ast.Name(id="JsonObject", ctx=ast.Load())]
                return True
            case _:
                pass
    return False


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
    params, keys = _imported_side(input_schema, "Params", notes, fallbacks, imports)
    result = None if output_schema is None else _imported_side(output_schema, "Result", notes, fallbacks, imports)[0]

    if ("pydantic", "ConfigDict") not in imports.values():
        # Every model gets a model_config (see _configure_model); generated classes must not shadow it.
        imports["ConfigDict" if "ConfigDict" not in imports else "_ConfigDict"] = ("pydantic", "ConfigDict")
    taken = {*imports, *reserved, *(b for b in dir(builtins) if not b.startswith("_")), "Params", "Result"}
    # Strict types are imported only when used, so their names are kept free up front.
    taken.update((*STRICT_TYPES, *KERNEL_TYPES, "Annotated"))
    params_names = {params.root: "Params"}
    for name in params.classes:
        if name != params.root:
            params_names[name] = _free(name, taken)
    parts: list[tuple[Side, Parsed, dict[str, str]]] = [("Params", params, params_names)]
    if result is not None:
        result_names = {result.root: "Result"}
        for name in result.classes:
            if name != result.root:
                result_names[name] = _free(f"Result{name}", taken)
        parts.append(("Result", result, result_names))

    classes: list[str] = []
    strict: set[str] = set()
    used: set[str] = set()
    for side, parsed, mapping in parts:
        renamer = _Renamer(mapping, parsed.forward_refs)
        for stmt in parsed.body:
            stmt = renamer.visit(stmt)
            if isinstance(stmt, ast.ClassDef) and _is_pydantic_model(stmt, imports):
                strict |= _faithful_types(stmt, side)
                _configure_model(stmt, imports)
                if side == "Params" and keys and stmt.name == "Params" and _check_keys(stmt, keys, imports):
                    strict.add("JsonObject")
            used.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name))
            classes.append(_typed_extras_note(ast.unparse(stmt)))
    if "JsonObject" in strict:
        # The root's base was the generator's BaseModel; where nothing else uses it, its import goes too.
        for name, origin in list(imports.items()):
            if origin == ("pydantic", "BaseModel") and name not in used and name not in extra_imports:
                del imports[name]
    for name in sorted(strict):
        if name == "Annotated":
            imports.setdefault(name, ("typing", name))
        else:
            imports[name] = ("ipybox_kernel" if name in KERNEL_TYPES else "pydantic", name)
    return ToolModels(imports, classes, result is not None, fallbacks, notes)

"""The allowlist that datamodel-code-generator's output must pass before ipybox uses it.

The generator's text is parsed, never executed: imports only from a few library modules, classes
with annotated fields, calls only to ``Field``-like constructors, string forward references only
to generated classes. `parse_generated` raises `Unsafe` for anything else, and the tool gets a
permissive model instead (see ``_modelgen``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ._pysource import copy_tree

__all__ = ("EXTRA_FIELD", "Import", "Parsed", "Unsafe", "parse_generated")

# Pydantic's annotation for the type of a model's undeclared keys (with ``extra='allow'``).
EXTRA_FIELD = "__pydantic_extra__"

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
# The generator's named type aliases (``X = TypeAliasType("X", <type>)``), which are inlined.
_ALIAS_ORIGINS = frozenset({("typing", "TypeAliasType"), ("typing_extensions", "TypeAliasType")})
# An alias used in several places is copied into each; this bounds what a hostile schema can grow.
MAX_INLINED_NODES = 20_000
_ANNOTATED_FORMS = frozenset({"Annotated"})


class Unsafe(Exception):
    """Generated code has a shape outside the allowlist."""


@dataclass
class Parsed:
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
            raise Unsafe("assignment inside an expression")
        if node.id not in self.imports and node.id not in self.classes and node.id not in _SAFE_BUILTINS:
            raise Unsafe(f"unknown name {node.id!r}")

    def expr(self, node: ast.expr, *, as_type: bool) -> None:
        """Check one expression; in a type position, strings are forward references and must name a class."""
        match node:
            case ast.Constant(value=str(text)) if as_type:
                if text not in self.classes:
                    raise Unsafe(f"string annotation {text!r} is not a generated class")
                self.forward_refs.append(node)
            case ast.Constant(value=value):
                if not isinstance(value, str | bytes | int | float | bool | None):
                    raise Unsafe("unexpected constant")
            case ast.Name():
                self.name(node)
            case ast.Attribute(value=ast.Name(id=owner) as owner_node, attr=attr):
                # Enum members of generated classes, and names in imported library modules.
                self.name(owner_node)
                is_module = owner in self.imports and self.imports[owner][1] is None
                if attr.startswith("_") or not (owner in self.classes or is_module):
                    raise Unsafe(f"attribute access {owner}.{attr}")
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
                        raise Unsafe("dict unpacking")
                    self.expr(item, as_type=False)
            case ast.BinOp(left=left, op=ast.BitOr(), right=right):
                self.expr(left, as_type=as_type)
                self.expr(right, as_type=as_type)
            case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=int() | float())):
                pass
            case ast.Call(func=ast.Name(id=func), args=args, keywords=keywords):
                origin = self.imports.get(func)
                if origin is None or origin[1] is None or func not in _ALLOWED_CALLS.get(origin[0], ()):
                    raise Unsafe(f"call to {func!r}")
                takes_types = func in _TYPE_ARGUMENT_CALLS
                for arg in args:
                    self.expr(arg, as_type=takes_types)
                for keyword in keywords:
                    if keyword.arg is None:
                        raise Unsafe("keyword unpacking")
                    self.expr(keyword.value, as_type=takes_types and keyword.arg == "item_type")
            case _:
                raise Unsafe(f"{type(node).__name__} expression")

    def class_def(self, node: ast.ClassDef) -> None:
        if node.decorator_list or node.keywords:
            raise Unsafe(f"class {node.name!r} has decorators or keywords")
        if node.name.startswith("_"):
            raise Unsafe(f"class name {node.name!r}")
        for base in node.bases:
            self.expr(base, as_type=True)
        for index, stmt in enumerate(node.body):
            match stmt:
                case ast.Expr(value=ast.Constant(value=str())) | ast.Pass():
                    pass
                case ast.Assign(
                    targets=[ast.Name(id="__annotations__")],
                    value=ast.Dict(keys=[ast.Constant(value="__pydantic_extra__")], values=[annotation]),
                ):
                    # The generator's spelling of typed extra fields (``additionalProperties`` next to
                    # ``properties``); pydantic's own is an annotation, which is what is kept.
                    self.expr(annotation, as_type=True)
                    node.body[index] = ast.AnnAssign(
                        target=ast.Name(id=EXTRA_FIELD, ctx=ast.Store()), annotation=annotation, simple=1
                    )
                case ast.AnnAssign(target=ast.Name(id=target), annotation=annotation, value=None, simple=1) if (
                    target == EXTRA_FIELD
                ):
                    self.expr(annotation, as_type=True)
                case ast.AnnAssign(target=ast.Name(id=target), annotation=annotation, value=value, simple=1):
                    _check_target(target, field=True)
                    self.expr(annotation, as_type=True)
                    if value is not None:
                        self.expr(value, as_type=False)
                case ast.Assign(targets=[ast.Name(id=target)], value=value):
                    _check_target(target, field=False)
                    self.expr(value, as_type=False)
                case _:
                    raise Unsafe(f"{type(stmt).__name__} statement in class {node.name!r}")

    def module_stmt(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, ast.ClassDef):
            raise Unsafe(f"{type(stmt).__name__} statement at module level")
        self.class_def(stmt)


def _check_target(name: str, *, field: bool) -> None:
    # Underscore names in a class body are special to Python (dunders), enum (_missing_, _ignore_)
    # or pydantic (private attributes); the generator renames such fields, so none should appear.
    if name.startswith("_") or (field and name == "model_config"):
        raise Unsafe(f"class attribute {name!r}")


def _inline_aliases(body: list[ast.stmt], imports: dict[str, Import]) -> list[ast.stmt]:
    """Replace each of the generator's ``X = TypeAliasType("X", T)`` by its type ``T`` where ``X`` is used.

    The generator names a constrained type that way (``additionalProperties: {"maximum": 255}``);
    inlined, the type is checked, renamed and made faithful like any other annotation. Recursive
    aliases, and inlining that would grow past `MAX_INLINED_NODES`, raise `Unsafe`.
    """
    aliases: dict[str, ast.expr] = {}
    rest: list[ast.stmt] = []
    for stmt in body:
        match stmt:
            case ast.Assign(
                targets=[ast.Name(id=target)],
                value=ast.Call(func=ast.Name(id=func), args=[ast.Constant(value=str(name)), value], keywords=[]),
            ) if imports.get(func) in _ALIAS_ORIGINS:
                if name != target or target in aliases or target in imports:
                    raise Unsafe(f"type alias {target!r}")
                aliases[target] = value
            case _:
                rest.append(stmt)
    if not aliases:
        return body
    resolved: dict[str, ast.expr] = {}
    budget = [MAX_INLINED_NODES]

    class Inliner(ast.NodeTransformer):
        def __init__(self, resolving: frozenset[str]) -> None:
            self.resolving = resolving

        def visit_Name(self, node: ast.Name) -> ast.expr:
            if node.id not in aliases or not isinstance(node.ctx, ast.Load):
                return node
            if node.id in self.resolving:
                raise Unsafe(f"recursive type alias {node.id!r}")
            if node.id not in resolved:
                inner = Inliner(self.resolving | {node.id})
                resolved[node.id] = inner.visit(copy_tree(aliases[node.id]))
            budget[0] -= sum(1 for _ in ast.walk(resolved[node.id]))
            if budget[0] < 0:
                raise Unsafe("type aliases inline to too large a type")
            return copy_tree(resolved[node.id])

    out = [Inliner(frozenset()).visit(stmt) for stmt in rest]
    used = {n.id for stmt in out for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    for name, origin in list(imports.items()):
        if origin in _ALIAS_ORIGINS and name not in used:
            del imports[name]
    return out


def parse_generated(text: str) -> Parsed:
    """Parse generated model code and check every statement against the allowlist.

    Raises:
        Unsafe: Something in ``text`` is outside the allowlist.
    """
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
                        raise Unsafe("star import")
                    imports[alias.asname or alias.name] = (module, alias.name)
            case ast.Import(names=names):
                for alias in names:
                    if alias.name not in _ALLOWED_MODULES:
                        raise Unsafe(f"import of {alias.name!r}")
                    imports[alias.asname or alias.name] = (alias.name, None)
            case ast.Import() | ast.ImportFrom():
                raise Unsafe("import from a module outside the allowlist")
            case ast.Expr(value=ast.Constant(value=str())):
                pass
            case ast.Expr(value=ast.Call(func=ast.Attribute(attr="model_rebuild"), args=[], keywords=[])):
                # With deferred building, pydantic resolves forward references on first use;
                # rebuilding here would build every validator at import.
                pass
            case _:
                body.append(stmt)
    body = _inline_aliases(body, imports)
    classes = [stmt.name for stmt in body if isinstance(stmt, ast.ClassDef)]
    if len(set(classes)) != len(classes):
        raise Unsafe("a class is defined twice")
    if shadowing := sorted(set(classes) & set(imports)):
        raise Unsafe(f"class {shadowing[0]!r} shadows an import")
    checker = _Checker(imports, classes)
    for stmt in body:
        checker.module_stmt(stmt)
    return Parsed(imports, body, classes, checker.forward_refs)

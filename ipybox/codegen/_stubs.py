"""Compact Python stubs of generated tool packages, for system prompts and tool descriptions.

The stubs are rendered from the generated files with `ast`; nothing is imported on the host. Each
tool module becomes a class-shaped namespace holding its models (fields with types, defaults and
one-line descriptions) and the signature of ``run``, under a header per server that says how to
import and call them::

    # MCP server 'everything': one module per tool, `from mcptools.everything import <tool>`; ...
    class echo:  # Echoes back the input string.
        class Params:
            message: str  # Message to echo
        def run(params: Params) -> str: ...
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

from ipybox._exceptions import UsageError
from ipybox_kernel._catalog import Server, Tool, field_keywords, load_server, run_def, server_packages, string_value

from ._pysource import comment_text, copy_tree, first_line

__all__ = ("render_tool_stubs",)

# Long enough for a useful sentence, short enough that a big server still fits a prompt.
DESCRIPTION_LIMIT = 120
# Types and defaults beyond this length (huge Literal enums, big default objects) are cut.
EXPRESSION_LIMIT = 200

# Field() keywords worth showing: they make calls fail when violated.
_CONSTRAINTS = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "pattern")


def _load_server(package_dir: Path, only: Sequence[str] | None) -> Server | None:
    try:
        return load_server(package_dir, only=only)
    except SyntaxError as exc:
        raise UsageError(f"{exc.filename!r} is not valid Python ({exc.msg}); generate its server again") from None


# Generated models use pydantic's strict types so that "5" is not sent as 5; to a reader they are
# the plain types, and ``ipybox_kernel.ToolText`` is a str with the result's content items.
_PLAIN = {"StrictInt": "int", "StrictFloat": "float", "StrictBool": "bool", "JsonInt": "int"}


class _Plain(ast.NodeTransformer):
    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        # Annotated[Literal[0, 1], JsonEqual]: how a Literal of numbers is matched, not what it is.
        match node:
            case ast.Subscript(value=ast.Name(id="Annotated"), slice=ast.Tuple(elts=[inner, ast.Name(id="JsonEqual")])):
                return self.visit(inner)
            case _:
                self.generic_visit(node)
                return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        # A JSON number is an int or a float; to a Python reader (PEP 484's numeric tower) a float.
        if ast.unparse(node) in ("StrictInt | StrictFloat", "int | float"):
            return ast.Name(id="float", ctx=ast.Load())
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(id=_PLAIN.get(node.id, node.id), ctx=node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        if ast.unparse(node) == "ipybox_kernel.ToolText":
            return ast.Name(id="ToolText", ctx=ast.Load())
        return node


def _plain(node: ast.expr) -> ast.expr:
    return _Plain().visit(copy_tree(node))


def _cut(node: ast.expr) -> str:
    """Source of `node`, shortened to about `EXPRESSION_LIMIT` while staying valid Python.

    Long ``Literal[...]`` types keep their first values and end in ``...``; any other long
    expression becomes ``...``.
    """
    node = _plain(node)
    text = ast.unparse(node)
    if len(text) <= EXPRESSION_LIMIT:
        return text
    match node:
        case ast.Subscript(value=head, slice=ast.Tuple(elts=values)):
            kept: list[str] = []
            budget = EXPRESSION_LIMIT - len(ast.unparse(head)) - 7
            for value in values:
                part = ast.unparse(value)
                if len(part) + 2 > budget:
                    break
                kept.append(part)
                budget -= len(part) + 2
            return f"{ast.unparse(head)}[{', '.join([*kept, '...'])}]"
        case ast.BinOp(left=left, op=ast.BitOr(), right=right):
            return f"{_cut(left)} | {_cut(right)}"
        case _:
            return "..."


def _render_field(stmt: ast.AnnAssign, indent: str) -> str:
    name = stmt.target.id if isinstance(stmt.target, ast.Name) else ast.unparse(stmt.target)
    annotation, default, keywords = field_keywords(stmt)
    match annotation, default:
        case ast.BinOp(left=inner, op=ast.BitOr(), right=ast.Constant(value=None)), ast.expr() if not (
            isinstance(default, ast.Constant) and default.value is None
        ):
            # Optional only because it has a default: show the type the server expects.
            annotation = inner
        case _:
            pass
    line = f"{indent}{name}: {_cut(annotation)}"
    if default is not None:
        line += f" = {_cut(default)}"
    notes: list[str] = []
    constraints = [f"{k}={_cut(keywords[k])}" for k in _CONSTRAINTS if k in keywords]
    if constraints:
        notes.append(comment_text(", ".join(constraints), limit=DESCRIPTION_LIMIT))
    alias = string_value(keywords.get("alias"))
    if alias and alias != name:
        notes.append(f"as {comment_text(repr(alias), limit=60)}")
    description = first_line(string_value(keywords.get("description")), limit=DESCRIPTION_LIMIT)
    if description:
        notes.append(description)
    return f"{line}  # {'; '.join(notes)}" if notes else line


def _docstring(node: ast.ClassDef | ast.FunctionDef | ast.Module) -> str:
    return first_line(ast.get_docstring(node, clean=True), limit=DESCRIPTION_LIMIT)


def _render_class(node: ast.ClassDef, indent: str) -> list[str]:
    # Every generated class is a pydantic model; the header says so once instead of per class.
    root_model = next(
        (b for b in node.bases if isinstance(b, ast.Subscript) and ast.unparse(b.value) == "RootModel"), None
    )
    doc = _docstring(node)
    comment = f"  # {doc}" if doc else ""
    if root_model is not None:
        return [f"{indent}{node.name} = {_cut(root_model.slice)}{comment}"]
    fields = [s for s in node.body if isinstance(s, ast.AnnAssign)]
    members = [s for s in node.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) != "model_config"]
    if not fields and not members:
        return [f"{indent}class {node.name}: ...{comment}"]
    lines = [f"{indent}class {node.name}:{comment}"]
    lines.extend(_render_field(f, indent + "    ") for f in fields)
    lines.extend(f"{indent}    {ast.unparse(m.targets[0])} = {_cut(m.value)}" for m in members)
    return lines


def _render_tool(tool: Tool) -> list[str]:
    run = run_def(tool.tree)
    assert run is not None  # _load_server only keeps modules with run()
    doc = _docstring(run)
    lines = [f"class {tool.module}:{'  # ' + doc if doc else ''}"]
    for stmt in tool.tree.body:
        if isinstance(stmt, ast.ClassDef):
            lines.extend(_render_class(stmt, "    "))
    returns = ast.unparse(_plain(run.returns)) if run.returns is not None else "str"
    optional = bool(run.args.defaults)
    lines.append(f"    def run(params: Params{' = Params()' if optional else ''}) -> {returns}: ...")
    return lines


def _select(found: Sequence[Server], servers: Sequence[str] | None, tools: Sequence[str] | None) -> list[Server]:
    selected = list(found)
    if servers is not None:
        known = {name for s in found for name in (s.name, s.package)}
        unknown = sorted(set(servers) - known)
        if unknown:
            raise UsageError(
                f"no generated package for server(s) {', '.join(map(repr, unknown))}; "
                f"generated: {', '.join(repr(s.name) for s in found) or 'none'}"
            )
        selected = [s for s in found if s.name in servers or s.package in servers]
    if tools is not None:
        known_tools = {name for s in selected for t in s.tools for name in (t.name, t.module)}
        unknown = sorted(set(tools) - known_tools)
        if unknown:
            raise UsageError(
                f"no generated module for tool(s) {', '.join(map(repr, unknown))}; pass MCP tool names or "
                "module names of the selected servers"
            )
        selected = [
            Server(s.name, s.package, tuple(t for t in s.tools if t.name in tools or t.module in tools))
            for s in selected
        ]
    return [s for s in selected if s.tools]


def render_tool_stubs(
    root_dir: Path | str,
    *,
    servers: Sequence[str] | None = None,
    tools: Sequence[str] | None = None,
) -> str:
    """Render generated tool packages as compact Python stubs for a model's context.

    Per server: a header with the import line and how to call a tool, then per tool module its
    models (fields with types, defaults and one-line descriptions), ``run``'s signature and a
    one-line docstring. Use ``len()`` of the result to budget the context window.

    Args:
        root_dir: The tools directory `generate_mcp_sources` wrote to.
        servers: Only these servers (server names or package names); all when None.
        tools: Only these tools (MCP tool names or module names); all when None.

    Raises:
        UsageError: `root_dir` is not a directory, or a requested server or tool was not generated.
    """
    for option, names in (("servers", servers), ("tools", tools)):
        if isinstance(names, str):
            raise UsageError(f"{option} takes a list of names, got the string {names!r}; pass [{names!r}]")
    root = Path(root_dir)
    if not root.is_dir():
        raise UsageError(f"{str(root)!r} is not a directory; pass the root_dir given to generate_mcp_sources")
    found = [s for d in server_packages(root) if (s := _load_server(d, servers))]
    blocks: list[str] = []
    for server in _select(found, servers, tools):
        lines = [
            f"# MCP server {comment_text(repr(server.name), limit=100)}: one module per tool, "
            f"`from {root.resolve().name}.{server.package} import <tool>`; "
            "call `<tool>.run(<tool>.Params(...))` (or pass a dict), `await <tool>.arun(...)` in async code. "
            "Params and Result are pydantic models; None for an optional field means not given. "
            "ToolText is the tool's text as a str, with every content item (images too) in .content."
        ]
        for tool in server.tools:
            lines.extend(_render_tool(tool))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + ("\n" if blocks else "")

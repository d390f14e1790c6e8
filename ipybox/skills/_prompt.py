"""Prompt stubs of saved skills: what a model needs to call one, read with `ast`, never imported.

One class-shaped namespace per skill, like the tool stubs (`ipybox.codegen._stubs`)::

    # Skills: code saved because it worked; `from skills.<name> import run`, then call run(...).
    class summarize_forecasts:  # Summarize a city's forecast in one line
        \"\"\"Fetch the forecast with mcptools.weather and keep the days that matter.\"\"\"
        def run(city: str, days: int = 3) -> str: ...  # The summary, one line per day.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ipybox_kernel._text import comment_text, first_line

from ._store import MAX_CODE_CHARS, Skill, list_skills, read_skill_file

__all__ = ("render_skill_stubs",)

# A skill's description and docstrings are text a model (or kernel code) wrote: cut, on one line each.
_LINE_LIMIT = 200
# The module docstring may say how to use the skill; its first lines are enough for a prompt.
_DOC_LINES = 5
_SIGNATURE_LIMIT = 300
HEADER = "# Skills: code saved because it worked; `from skills.<name> import run`, then call run(...)."


def render_skill_stubs(skills_dir: Path | str) -> str:
    """Compact stubs of the skills in ``skills_dir``: name, description, the module's docstring and
    ``run``'s signature and first docstring line. Empty when there are no skills.

    The code is parsed, never run; a skill whose module no longer parses shows its description only.
    """
    skills = list_skills(skills_dir)
    if not skills:
        return ""
    lines = [HEADER]
    for skill in skills:
        lines.extend(_render(skill))
    return "\n".join(lines) + "\n"


def _render(skill: Skill) -> list[str]:
    lines = [f"class {skill.name}:  # {comment_text(skill.description, limit=_LINE_LIMIT)}"]
    try:
        # Characters, not bytes, bound the code when it is saved: up to 4 bytes each in UTF-8.
        tree = ast.parse(read_skill_file(skill.path / "__init__.py", 4 * MAX_CODE_CHARS))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return [*lines, "    ...  # (its module cannot be read or parsed)"]
    doc = [comment_text(line, limit=_LINE_LIMIT) for line in (ast.get_docstring(tree) or "").splitlines()[:_DOC_LINES]]
    if any(doc):
        lines.append('    """' + "\n    ".join(doc).rstrip().replace('"""', "'''") + '"""')
    run = next(
        (s for s in tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "run"), None
    )
    if run is None:
        return [*lines, "    ...  # (it defines no run)"]
    prefix = "async def" if isinstance(run, ast.AsyncFunctionDef) else "def"
    signature = f"({ast.unparse(run.args)})" + (f" -> {ast.unparse(run.returns)}" if run.returns else "")
    if len(signature) > _SIGNATURE_LIMIT:
        signature = "(...)"
    summary = first_line(ast.get_docstring(run), limit=_LINE_LIMIT)
    lines.append(f"    {prefix} run{signature}: ...{'  # ' + summary if summary else ''}")
    return lines

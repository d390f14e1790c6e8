"""Skills as kernel code sees them, and the ``SKILL.md`` format the host shares.

A skill is a directory ``<skills dir>/<name>/`` holding ``SKILL.md`` (frontmatter with ``name`` and
``description``, the format Claude Code and other agents use) and ``__init__.py``, the module kernel
code imports as ``skills.<name>``. The skills directory is mounted read-only: kernel code lists skills
by reading it, and saves one only by asking the host (`save_skill`, approved like any tool call).

Only the standard library is used here; the host imports the format functions from this module too.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._client import call_tool
from ._protocol import SKILLS_DIR_ENV

__all__ = (
    "MAX_DESCRIPTION_CHARS",
    "MAX_SKILL_MD_BYTES",
    "SKILLS_PACKAGE",
    "SkillInfo",
    "is_skill_name",
    "list_skills",
    "parse_skill_md",
    "render_skill_md",
    "save_skill",
    "scan_skills",
)

# The package name skills are imported under, whatever the skills directory is called.
SKILLS_PACKAGE = "skills"
# Claude Code's own limit for a skill's description.
MAX_DESCRIPTION_CHARS = 1024
# A SKILL.md is a few lines of frontmatter and a short note; anything far larger is not ours.
MAX_SKILL_MD_BYTES = 64 * 1024

_FENCE = "---"
_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9_-]*):(?:[ \t]+(.*))?")
# Lowercase, so that names cannot collide on a case-insensitive filesystem.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def is_skill_name(name: str) -> bool:
    """Whether ``name`` has a skill name's form: ``a-z`` first, then ``a-z``, digits, ``_``; 64 at most."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class SkillInfo:
    """A saved skill, as listed from its ``SKILL.md``.

    Attributes:
        name: The skill's name, also its module name: ``from skills.<name> import run``.
        description: One line on what the skill does and when to use it.
    """

    name: str
    description: str

    @property
    def module(self) -> str:
        """The module to import, ``"skills.<name>"``."""
        return f"{SKILLS_PACKAGE}.{self.name}"


def render_skill_md(name: str, description: str) -> str:
    """The ``SKILL.md`` of a skill: frontmatter (the description as a JSON string, which YAML reads
    as a double-quoted scalar whatever characters it holds) and a note on how to use it."""
    return (
        f"{_FENCE}\nname: {name}\ndescription: {json.dumps(description, ensure_ascii=False)}\n{_FENCE}\n\n"
        f"{description}\n\nUse it from Python: `from {SKILLS_PACKAGE}.{name} import run`; the module's docstring "
        "and `run`'s signature say how.\n"
    )


def parse_skill_md(text: str) -> tuple[str, str]:
    """The ``name`` and ``description`` in a ``SKILL.md``'s frontmatter.

    Strict about the two fields (each on one line: plain, single- or double-quoted) and lenient
    about others, which are skipped, so that hand-written files with more fields still parse.

    Raises:
        ValueError: No frontmatter, or either field is missing, repeated, empty or not one line.
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != _FENCE:
        raise ValueError(f"SKILL.md must start with a '{_FENCE}' line opening its frontmatter")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == _FENCE)
    except StopIteration:
        raise ValueError(f"SKILL.md's frontmatter has no closing '{_FENCE}' line") from None
    found: dict[str, str] = {}
    for line in lines[1:end]:
        match = _FIELD.fullmatch(line.rstrip())
        if match is None or match.group(1) not in ("name", "description"):
            continue
        key = match.group(1)
        if key in found:
            raise ValueError(f"SKILL.md's frontmatter has {key!r} twice")
        found[key] = _scalar(match.group(2) or "", key)
    for key in ("name", "description"):
        if not found.get(key):
            raise ValueError(f"SKILL.md's frontmatter needs a non-empty {key!r} on one line")
    return found["name"], found["description"]


def _scalar(raw: str, key: str) -> str:
    if raw.startswith('"'):
        try:
            value: object = json.loads(raw)
        except ValueError:
            raise ValueError(f"SKILL.md's {key!r} is not a valid double-quoted string") from None
        if not isinstance(value, str):
            raise ValueError(f"SKILL.md's {key!r} is not a string")
        return value
    if raw.startswith("'"):
        if len(raw) < 2 or not raw.endswith("'") or "'" in raw[1:-1].replace("''", ""):
            raise ValueError(f"SKILL.md's {key!r} is not a valid single-quoted string")
        return raw[1:-1].replace("''", "'")
    # A plain scalar; a trailing ' #' starts a YAML comment.
    return raw.split(" #", 1)[0].strip()


def scan_skills(root: Path, read: Callable[[Path], str]) -> list[SkillInfo]:
    """The skills under ``root``, by name; directories without a readable, valid ``SKILL.md`` whose
    name matches the directory, or without a module, are left out.

    ``read`` returns a file's text (bounded; the host's never follows a symlink) or raises OSError.
    """
    try:
        names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []
    skills: list[SkillInfo] = []
    for name in names:
        if not is_skill_name(name):
            continue
        try:
            declared, description = parse_skill_md(read(root / name / "SKILL.md"))
            if not (root / name / "__init__.py").is_file():
                continue
        except (OSError, ValueError):
            continue
        if declared == name:
            skills.append(SkillInfo(name, description))
    return skills


def _read_bounded(path: Path) -> str:
    with open(path, "rb") as file:
        return file.read(MAX_SKILL_MD_BYTES).decode("utf-8", errors="replace")


def list_skills() -> list[SkillInfo]:
    """The skills saved in this kernel's skills directory (read from its read-only mount, no call to
    the host); empty when the executor has no skills directory."""
    root = os.environ.get(SKILLS_DIR_ENV)
    return scan_skills(Path(root), _read_bounded) if root else []


def save_skill(name: str, code: str, description: str, *, overwrite: bool = False) -> str:
    """Ask the host to save ``code`` as the skill ``name``, importable as ``skills.<name>``.

    The host asks for approval like for any tool call, then checks the skill: ``name`` a lowercase
    identifier that shadows nothing, ``code`` a module that compiles and defines ``run``, and
    ``description`` one line. Give the module a docstring and ``run`` typed parameters and a
    docstring: prompts show them.

    Args:
        name: The skill's name and module name.
        code: The module's source.
        description: One line on what the skill does and when to use it.
        overwrite: Replace an existing skill of this name (the approval request shows it); the
            next import in this kernel loads the new code.

    Returns:
        The host's confirmation.

    Raises:
        ToolCallRejected: The application rejected the save.
        ToolExecutionError: The host refused the skill; the message says what to change.
    """
    output = call_tool(
        "ipybox",
        "save_skill",
        {"name": name, "code": code, "description": description, "overwrite": overwrite},
    )
    # The import system caches directory listings; the new skill must be importable at once, and an
    # overwritten one imported afresh rather than from the module loaded before.
    importlib.invalidate_caches()
    sys.modules.pop(f"{SKILLS_PACKAGE}.{name}", None)
    return output.text

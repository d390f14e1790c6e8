"""Skills: code actions that worked, saved as described, importable modules.

A skill lives in the executor's skills directory as ``<name>/SKILL.md`` and ``<name>/__init__.py``;
kernel code imports it as ``skills.<name>``. The public names are re-exported by `ipybox`.
"""

from ._prompt import render_skill_stubs
from ._store import Skill, list_skills, save_skill

__all__ = ("Skill", "list_skills", "render_skill_stubs", "save_skill")

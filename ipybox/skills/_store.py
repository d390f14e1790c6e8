"""The skills directory on the host: checking, writing and listing skills.

A skill is ``<skills dir>/<name>/`` with ``SKILL.md`` (``name``/``description`` frontmatter) and
``__init__.py``, so that kernel code imports it as ``skills.<name>`` — the import path is the
directory, and the module sits next to its ``SKILL.md`` as in other agents' skills. Its code comes
from kernel code or a model, so the host never imports it: it compiles it and reads its ``run``
with `ast`. The directory is held to the tools directory's rules (`ipybox._tooldir`): the host's
own, no symlink on its way, mounted read-only into the sandbox; every file is written through
descriptors that never follow a symlink, and a skill appears or changes by a rename.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import keyword
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ipybox._exceptions import InvalidSkill, UsageError
from ipybox._tooldir import open_tools_dir, prepare_package_dir, tools_dir_path
from ipybox_kernel._skills import (
    MAX_DESCRIPTION_CHARS,
    MAX_SKILL_MD_BYTES,
    SKILLS_PACKAGE,
    is_skill_name,
    render_skill_md,
    scan_skills,
)

__all__ = (
    "MAX_CODE_CHARS",
    "SAVE_SKILL_SCHEMA",
    "SKILLS_PACKAGE",
    "Skill",
    "check_skill",
    "list_skills",
    "prepare_skills_dir",
    "read_skill_file",
    "save_skill",
    "skill_arguments",
    "skills_dir_path",
    "write_skill",
)

SKILLS_PACKAGE_INIT = '"""Skills saved with ipybox: one subpackage per skill (SKILL.md and __init__.py)."""\n'
# A skill is one module a model wrote; far more than any such module, far less than a risk to the
# host's memory when it is parsed.
MAX_CODE_CHARS = 256 * 1024
# Names a skill may not take: its module would be confused with these packages in prompts and code.
_RESERVED = frozenset({"ipybox", "ipybox_kernel", "mcptools", SKILLS_PACKAGE})
_MODULE = "__init__.py"
_CARD = "SKILL.md"
_LABEL_CHARS = 100
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Skill:
    """A saved skill.

    Attributes:
        name: Its name, also its module name in the kernel.
        description: One line on what it does and when to use it (from its ``SKILL.md``).
        path: Its directory on the host, holding ``SKILL.md`` and ``__init__.py``.
    """

    name: str
    description: str
    path: Path

    @property
    def module(self) -> str:
        """What kernel code imports: ``"skills.<name>"`` (``from skills.<name> import run``)."""
        return f"{SKILLS_PACKAGE}.{self.name}"


def check_skill(name: object, code: object, description: object, *, reserved: Iterable[str] = ()) -> None:
    """Check a skill before anything is written; the code is compiled, never run.

    Args:
        name: Must be a lowercase identifier (``a-z``, digits, ``_``; at most 64 characters) that is
            not a keyword, a standard-library module, ``ipybox``, ``ipybox_kernel``, ``mcptools``,
            ``skills`` or one of ``reserved``.
        code: A Python module (no IPython syntax, no top-level ``await``) defining ``run`` at its top
            level, at most `MAX_CODE_CHARS` characters.
        description: One printable line, at most 1024 characters.
        reserved: Further names to refuse (the tools package's name).

    Raises:
        InvalidSkill: The field and what to change.
    """
    # Cut: a name that is not one may be any text kernel code sent, and errors repeat it.
    label = (name if isinstance(name, str) else repr(name))[:_LABEL_CHARS]
    _check_name(label, name, reserved)
    _check_description(label, description)
    _check_code(label, code)


def _check_name(label: str, name: object, reserved: Iterable[str]) -> None:
    if not isinstance(name, str) or not is_skill_name(name):
        raise InvalidSkill(
            label,
            "name",
            "must be a lowercase Python identifier of at most 64 characters: letters a-z, digits "
            "and '_', starting with a letter (e.g. 'summarize_forecasts')",
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise InvalidSkill(name, "name", "is a Python keyword; choose a name that says what the skill does")
    if name in sys.stdlib_module_names or name in _RESERVED or name in set(reserved):
        raise InvalidSkill(
            name, "name", "is the name of a module kernel code imports; choose one that says what the skill does"
        )


def _check_description(label: str, description: object) -> None:
    if not isinstance(description, str) or not description.strip():
        raise InvalidSkill(label, "description", "must be a non-empty string saying what the skill does")
    if not description.isprintable():
        raise InvalidSkill(
            label, "description", "must be one line of printable text (no line breaks, tabs or control characters)"
        )
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise InvalidSkill(
            label,
            "description",
            f"has {len(description)} characters; at most {MAX_DESCRIPTION_CHARS}: say what the skill does in a "
            "sentence and put details into the module's docstring",
        )


def _check_code(label: str, code: object) -> None:
    if not isinstance(code, str):
        raise InvalidSkill(label, "code", f"must be a string of Python source, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise InvalidSkill(
            label, "code", f"has {len(code)} characters; at most {MAX_CODE_CHARS}: split it, or load data from files"
        )
    filename = f"{SKILLS_PACKAGE}/{label}/{_MODULE}"
    try:
        tree = ast.parse(code, filename)
        # The second pass catches what the parser lets through ('return' or 'await' outside a function).
        compile(tree, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise InvalidSkill(
            label,
            "code",
            f"does not compile: {exc.msg}{where}; it must be a plain Python module (no magics, no top-level await)",
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise InvalidSkill(label, "code", f"does not compile ({type(exc).__name__}); simplify it") from None
    if not any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "run" for s in tree.body):
        raise InvalidSkill(
            label,
            "code",
            "defines no top-level function 'run'; wrap what the skill does in 'def run(...) -> ...:' with typed "
            "parameters and a docstring",
        )


# The arguments of ipybox.save_skill as kernel code sends them (ipybox_kernel.save_skill).
SAVE_SKILL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "code": {"type": "string"},
        "description": {"type": "string"},
        "overwrite": {"type": "boolean"},
    },
    "required": ["name", "code", "description"],
    "additionalProperties": False,
}


def skill_arguments(arguments: Mapping[str, object]) -> tuple[str, str, str, bool]:
    """``name``, ``code``, ``description`` and ``overwrite`` of a save request from kernel code.

    Raises:
        InvalidSkill: One of them is missing or of the wrong type.
    """
    name, code, description = (arguments.get(key) for key in ("name", "code", "description"))
    check_skill(name, code, description)
    overwrite = arguments.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise InvalidSkill(str(name), "overwrite", "must be true or false")
    assert isinstance(name, str) and isinstance(code, str) and isinstance(description, str)
    return name, code, description, overwrite


def skills_dir_path(given: Path, *, kernel_writable: Sequence[Path], tools_dir: Path | None) -> Path:
    """The real path of an executor's skills directory ``given`` (see `ipybox._tooldir.tools_dir_path`).

    Raises:
        UsageError: It goes through a symlink the kernel may have planted, is the filesystem root,
            or overlaps the tools directory (or that is called ``skills`` too).
    """
    real = tools_dir_path(given, kernel_writable=kernel_writable, what="skills_dir")
    if real.parent == real:
        raise UsageError("skills_dir cannot be the filesystem root")
    if tools_dir is not None and (
        real.is_relative_to(tools_dir) or tools_dir.is_relative_to(real) or tools_dir.name == SKILLS_PACKAGE
    ):
        raise UsageError(
            f"skills_dir {str(given)!r} and tools_dir {str(tools_dir)!r} overlap (or the tools package is named "
            f"{SKILLS_PACKAGE!r}); give each its own directory"
        )
    return real


def prepare_skills_dir(
    given: Path | str, *, kernel_writable: Sequence[Path] = (), tools_dir: Path | None = None
) -> Path:
    """Create the skills directory if it is missing and check it (see `ipybox._tooldir`); its real path.

    Raises:
        UsageError: It cannot be trusted, or overlaps ``tools_dir``; the message names the fix.
    """
    skills_dir_path(Path(given), kernel_writable=kernel_writable, tools_dir=tools_dir)
    return prepare_package_dir(given, kernel_writable=kernel_writable, what="skills_dir", init_text=SKILLS_PACKAGE_INIT)


def write_skill(root: Path, name: str, code: str, description: str, *, overwrite: bool) -> Skill:
    """Write a checked skill into the prepared skills directory at its real path ``root``.

    A new skill is built in a temporary directory and renamed into place, so kernel code sees all
    of it or nothing; an overwritten one has each file replaced by a rename.

    Raises:
        InvalidSkill: The skill exists and ``overwrite`` is false.
        UsageError: The skills directory or the skill's directory cannot be trusted.
    """
    files = {_MODULE: code, _CARD: render_skill_md(name, description)}
    root_fd = open_tools_dir(root, what="skills_dir")
    try:
        try:
            info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            _create(root_fd, name, files)
        else:
            if not overwrite:
                raise InvalidSkill(
                    name,
                    "name",
                    "is taken by a saved skill; pass overwrite=True to replace it, or choose another name",
                )
            if not stat.S_ISDIR(info.st_mode):
                raise UsageError(
                    f"{str(root / name)!r} is not a directory (or is a symlink); delete it to save the skill {name!r}"
                )
            _write_files(root_fd, name, files, _replace)
    finally:
        os.close(root_fd)
    return Skill(name, description, root / name)


def _create(root_fd: int, name: str, files: dict[str, str]) -> None:
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    os.mkdir(temp, 0o755, dir_fd=root_fd)
    try:
        _write_files(root_fd, temp, files, _write_new)
        try:
            os.rename(temp, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise InvalidSkill(
                name, "name", "was taken by another save meanwhile; pass overwrite=True to replace it"
            ) from None
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(temp, dir_fd=root_fd)
        raise


def _write_files(parent_fd: int, directory: str, files: dict[str, str], write: Callable[[int, str, str], None]) -> None:
    dir_fd = os.open(directory, _NOFOLLOW_DIR, dir_fd=parent_fd)
    try:
        for filename, text in files.items():
            write(dir_fd, filename, text)
    finally:
        os.close(dir_fd)


def _write_new(dir_fd: int, filename: str, text: str) -> None:
    fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def _replace(dir_fd: int, filename: str, text: str) -> None:
    temp = f".{filename}.{secrets.token_hex(6)}.tmp"
    _write_new(dir_fd, temp, text)
    try:
        # rename() replaces a symlink at the destination rather than writing through it.
        os.rename(temp, filename, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def read_skill_file(path: Path, limit: int) -> str:
    """At most ``limit`` bytes of the file at the real ``path`` as text, opened one component at a
    time without following a symlink (kernel code may have planted one when it ran unsandboxed).

    Raises:
        OSError: It cannot be opened that way.
    """
    fd = os.open("/", _NOFOLLOW_DIR)
    try:
        for part in path.parts[1:-1]:
            child = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        file_fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return file.read(limit).decode("utf-8", errors="replace")


def list_skills(skills_dir: Path | str) -> list[Skill]:
    """The skills saved in ``skills_dir``, by name (an empty list when it does not exist).

    A skill directory without a valid ``SKILL.md`` naming it, or without its module, is left out.
    """
    root = Path(os.path.realpath(skills_dir))
    found = scan_skills(root, lambda path: read_skill_file(path, MAX_SKILL_MD_BYTES))
    return [Skill(info.name, info.description, root / info.name) for info in found]


def save_skill(skills_dir: Path | str, name: str, code: str, *, description: str, overwrite: bool = False) -> Skill:
    """Save ``code`` as the skill ``name`` in ``skills_dir``, without a running executor.

    Kernel code of an executor with this ``skills_dir`` imports it as ``skills.<name>``. The
    directory is created if it is missing; it must be a directory of your own that others cannot
    write, and not a symlink.

    Args:
        skills_dir: The skills directory.
        name: The skill's name and module name: a lowercase identifier that is not a keyword and
            shadows no module kernel code imports.
        code: A Python module that defines ``run`` (give it and the module docstrings and typed
            parameters: prompts show them). It is compiled, not run.
        description: One line on what the skill does and when to use it.
        overwrite: Replace a skill of the same name.

    Returns:
        The saved skill.

    Raises:
        InvalidSkill: The name, code or description cannot be used, or the skill exists and
            ``overwrite`` is false; the message says what to change.
        UsageError: The skills directory cannot be trusted.
    """
    check_skill(name, code, description)
    root = prepare_skills_dir(skills_dir)
    return write_skill(root, name, code, description, overwrite=overwrite)

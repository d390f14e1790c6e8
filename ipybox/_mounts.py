"""The checked read-only mounts a kernel gets from its `KernelSettings`, written as data.

Each `ReadOnlyMount` names a `KernelSettings` attribute holding a host directory, how that
directory is checked (and created) before every kernel start, the variable that tells the kernel
where it is, and the package it is importable as. Everything that starts a kernel (the executor's
host side, the pool, the launch) goes over `MOUNTS`, so a new checked mount is one more attribute
of `KernelSettings` (``_settings.py``), one more row here, and whatever the kernel does with it
(``ipybox_kernel``).

The tools directory is not one of them: it is made per kernel by a pool with separate workspaces,
mounted only once it exists, and has a part (the manifest) the kernel must not see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ipybox_kernel._protocol import SKILLS_DIR_ENV

from ._settings import KernelSettings
from .skills._store import SKILLS_PACKAGE, prepare_skills_dir

__all__ = ("MOUNTS", "ReadOnlyMount", "mounted", "prepare_mounts")


@dataclass(frozen=True, kw_only=True)
class ReadOnlyMount:
    """A host directory mounted read-only into the kernel, checked again before every start.

    Attributes:
        setting: The `KernelSettings` attribute that holds the directory (None there: no mount).
        env: The kernel's environment variable naming the directory.
        package: The name it is importable as (linked into the import root under it).
        prepare: Creates the directory if it is missing and checks it: given the path as given,
            the host directories kernel code can write to, and the real tools directory (which it
            must not overlap); returns its real path. Raises UsageError with the fix.
    """

    setting: str
    env: str
    package: str
    prepare: Callable[[Path, Sequence[Path], Path | None], Path]


MOUNTS: tuple[ReadOnlyMount, ...] = (
    ReadOnlyMount(
        setting="skills_dir",
        env=SKILLS_DIR_ENV,
        package=SKILLS_PACKAGE,
        prepare=lambda given, writable, tools: prepare_skills_dir(given, kernel_writable=writable, tools_dir=tools),
    ),
)


def mounted(settings: KernelSettings) -> Iterator[tuple[ReadOnlyMount, Path]]:
    """The mounts ``settings`` asks for, with their directories."""
    for mount in MOUNTS:
        path: Path | None = getattr(settings, mount.setting)
        if path is not None:
            yield mount, path


def prepare_mounts(
    settings: KernelSettings, *, kernel_writable: Sequence[Path], tools_dir: Path | None
) -> KernelSettings:
    """``settings`` with each mount's directory created if missing, checked, and real.

    Raises:
        UsageError: A directory cannot be trusted; the message names the fix.
    """
    real = {mount.setting: mount.prepare(path, kernel_writable, tools_dir) for mount, path in mounted(settings)}
    return dataclasses.replace(settings, **real) if real else settings

"""The kernel's OS sandbox: bubblewrap with a seccomp filter, and pids and memory cgroups.

``_sandbox`` resolves the configuration and builds the bwrap command line, ``_seccomp`` the syscall
filter it installs, ``_cgroup`` the per-sandbox process and memory limits. A second backend (another
isolation technology, or a remote host) is a sibling of these modules behind the same two calls the
kernel makes: `resolve_sandbox` and `bwrap_argv`. Its public names (`SandboxConfig`, `SandboxUnavailable`) are
defined with the kernel settings and the errors, and exported by ``ipybox`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipybox._lazy import lazy_names

if TYPE_CHECKING:
    from ipybox._exceptions import SandboxUnavailable as SandboxUnavailable
    from ipybox._settings import SandboxConfig as SandboxConfig

_LAZY = {
    "SandboxConfig": "ipybox._settings",
    "SandboxUnavailable": "ipybox._exceptions",
}

__all__ = ("SandboxConfig", "SandboxUnavailable")

if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, _LAZY)

"""The kernel pod that deploy/ describes: the pod template rendered as Enterprise Gateway renders it,
and the runtime it gives the kernel with the image's Dockerfile (tests/test_deploy.py checks the
files' fields, tests/test_kernel_image.py runs a kernel under them)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jinja2
import yaml

__all__ = ("DEPLOY", "KERNEL_VARIABLES", "KernelRuntime", "dockerfile_user", "kernel_runtime", "render_pod")

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DOCKERFILE = DEPLOY / "kernel-image" / "Dockerfile"
KERNEL_VARIABLES = {
    "kernel_pod_name": "kernel-abc",
    "kernel_namespace": "ipybox-kernels",
    "kernel_id": "abc",
    "kernel_image": "example.org/ipybox-kernel:1.0.0",
    "kernel_username": "agent",
}
# What the Dockerfile's base image (python:3.12-slim) sets, which the Dockerfile itself does not show.
BASE_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_QUANTITY_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def render_pod(extra: dict[str, Any]) -> dict[str, Any]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    text = env.from_string((DEPLOY / "kubernetes" / "kernel-pod.yaml.j2").read_text()).render(
        **KERNEL_VARIABLES, **extra
    )
    return cast("dict[str, Any]", yaml.safe_load(text))


@dataclass(frozen=True)
class KernelRuntime:
    """What the kernel process gets in the pod: the pod's fields where they override the image's."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    env: dict[str, str]
    workdir: str
    tmp_bytes: int
    requirements: tuple[str, ...]
    """What the Dockerfile's ``pip install`` installs (``ipybox==${IPYBOX_VERSION}`` among them)."""
    compile: bool
    """Whether it compiles bytecode at install time (the kernel cannot: read-only root, and
    ``PYTHONDONTWRITEBYTECODE``)."""


def _final_stage() -> list[str]:
    """The Dockerfile's instructions after its last FROM, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[last_from + 1 :]


def dockerfile_user() -> tuple[int, int]:
    """The Dockerfile's last ``USER uid:gid``."""
    [*_, user] = [line.split()[1] for line in _final_stage() if line.startswith("USER ")]
    uid, gid = user.split(":")
    return int(uid), int(gid)


def _size(quantity: str) -> int:
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    if found is None:
        raise ValueError(f"a size like 512Mi was expected in the pod template, got {quantity!r}")
    return int(found[1]) * _QUANTITY_UNITS[found[2]]


def kernel_runtime() -> KernelRuntime:
    """The runtime of the rendered pod's container on the Dockerfile's image."""
    stage = _final_stage()
    env = dict(BASE_IMAGE_ENV)
    for line in stage:
        if not line.startswith("ENV "):
            continue
        for item in line.split()[1:]:
            key, sep, value = item.partition("=")
            # Only the unquoted KEY=value form: anything else fails here rather than being misread.
            if not sep or value.startswith(("'", '"')):
                raise ValueError(f"the Dockerfile's {line!r} is not in the KEY=value form this test reads")
            env[key] = value
    [pip] = [line for line in stage if line.startswith("RUN pip install ")]
    args = shlex.split(pip.removeprefix("RUN ").split("&&")[0])[2:]
    pod = render_pod({})
    [container] = pod["spec"]["containers"]
    security = pod["spec"]["securityContext"]
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    [tmp] = [v for v in pod["spec"]["volumes"] if v["name"] == "tmp"]
    return KernelRuntime(
        uid=security["runAsUser"],
        gid=security["runAsGroup"],
        groups=(security["fsGroup"],),
        env=env,
        workdir=container["workingDir"],
        tmp_bytes=_size(tmp["emptyDir"]["sizeLimit"]),
        requirements=tuple(arg for arg in args if not arg.startswith("-")),
        compile="--compile" in args,
    )

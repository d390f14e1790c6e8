"""The kernel image of deploy/kernel-image, run under the kernel pod's constraints without Docker or
Kubernetes, behind a real Jupyter Kernel Gateway, driven with ``push_sources=False``.

- The image: a fresh venv with what the Dockerfile's ``pip install`` installs, ipybox from the wheel
  built from this checkout, bytecode compiled as ``--compile`` does (with ``push_sources=False`` the
  image provides ``ipybox_kernel``; the host pushes the generated tool modules, which are its own).
  The host's root, read-only, stands in for the rest of the image's root filesystem.
- The pod: the kernelspec runs the venv's python under bubblewrap with the rendered pod template's
  user, group and fsGroup (a real uid 1000 on the host: ``setpriv`` after the mounts, as a container
  runtime does; bwrap's own ``--uid`` as root maps uid 1000 to the host's root, which owns and can
  read root's files), no capabilities and no_new_privs, a read-only root, a tmpfs ``/tmp`` of the
  emptyDir's size as the only writable place, the environment of the Dockerfile and the pod, own
  pid/ipc/uts namespaces, and no user namespaces (``--disable-userns``; in a pod, the RuntimeDefault
  seccomp profile refuses them to a container without CAP_SYS_ADMIN). The network namespace is the
  host's: the gateway reaches the kernel's ZMQ ports on 127.0.0.1, as it reaches a pod's.

What needs a cluster stays unproven here: the image pull, Enterprise Gateway's launcher and its
encrypted connection info, NetworkPolicy enforcement, seccomp RuntimeDefault, resource limits.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from approval_support import CATCH_REJECTED, collect
from deploy_support import KernelRuntime, kernel_runtime
from install_support import uv_command
from servers.gateway import Gateway, run_gateway

import ipybox
from ipybox import (
    CodeExecutor,
    GatewayKernel,
    KernelStartError,
    Timeouts,
)
from ipybox._manifest import MANIFEST_DIR

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.install,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="running the kernel as the pod's uid 1000 needs root"),
]

# Where the kernel sees the image's venv and its connection file.
IMAGE_VENV = "/opt/ipybox"
CONNECTION_FILE = "/run/ipybox/connection.json"
# uv resolves against the index, then copies what its cache holds (scripts/setup.sh filled it).
INSTALL_TIMEOUT = 120.0
# A kernel start under two sandboxes on a loaded 2-core machine; a failed start ends well before.
START_TIMEOUT = 60.0
KERNEL_SPEC = "ipybox-image"
KERNEL_SPEC_WITHOUT_IPYBOX = "ipybox-image-without-ipybox"
KERNEL_SPEC_OTHER_IPYBOX = "ipybox-image-other-ipybox"


def make_image(root: Path, runtime: KernelRuntime, wheel: Path | None) -> Path:
    """A venv with the Dockerfile's requirements, ipybox's from ``wheel`` (None: left out, an image
    that breaks the recipe)."""
    requirements = [r for r in runtime.requirements if not r.startswith("ipybox")]
    if wheel is not None:
        pinned = [r for r in runtime.requirements if r.startswith("ipybox")]
        assert pinned == ["ipybox==${IPYBOX_VERSION}"], (
            f"the Dockerfile must pin ipybox to the host's version: {pinned}"
        )
        requirements.append(str(wheel))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    uv = uv_command()
    compile_ = ["--compile-bytecode"] if runtime.compile else []
    python = root / "bin" / "python"
    for args in (
        ["venv", "--quiet", "--python", sys.executable, str(root)],
        # Copies, not links into uv's cache: nothing done to the image can change the cache.
        ["pip", "install", "--quiet", "--link-mode=copy", "--python", str(python), *compile_, *requirements],
    ):
        subprocess.run([*uv, *args], env=env, check=True, timeout=INSTALL_TIMEOUT, stdin=subprocess.DEVNULL)
    return root


def other_ipybox(image: Path, root: Path) -> Path:
    """``image`` with one line added to one of ipybox_kernel's modules, as an image built from another
    ipybox version has it (hard links for the rest: nothing written here changes ``image``)."""
    shutil.copytree(image, root, symlinks=True, copy_function=os.link)
    [module] = root.glob("lib/python3.*/site-packages/ipybox_kernel/_text.py")
    text = module.read_text()
    module.unlink()
    module.write_text(text + "# another version\n")
    return root


def _interpreter_mounts(prefix: Path) -> list[str]:
    """bwrap arguments that show uid 1000 the Python installation the venv runs on, at its own path.

    The image has its Python in /usr/local; here it may live under a directory only root can enter
    (pyenv or uv under /root), or under /opt, which the image's venv replaces: that directory becomes
    an empty read-only tmpfs holding the installation alone.
    """
    below_root = [*reversed(prefix.parents), prefix][1:]
    covered = next((p for p in below_root if p == Path("/opt") or not p.stat().st_mode & stat.S_IXOTH), None)
    if covered is None:
        return []
    args = [] if covered == Path("/opt") else ["--perms", "0755", "--tmpfs", str(covered)]
    for between in reversed(prefix.relative_to(covered).parents[:-1]):
        args += ["--perms", "0755", "--dir", str(covered / between)]
    return [*args, "--ro-bind", str(prefix), str(prefix), "--remount-ro", str(covered)]


def pod_argv(runtime: KernelRuntime, image: Path, connection_file: str, command: list[str]) -> list[str]:
    """``command`` run as the pod runs the image's kernel (see the module's docstring)."""
    setenv = [arg for name, value in runtime.env.items() for arg in ("--setenv", name, value)]
    path = f"{IMAGE_VENV}/bin:{runtime.env['PATH']}"
    return [
        # The gateway's connection file is root's (0600): passed as a file descriptor, bwrap puts a
        # read-only copy the kernel can read in its /run (Enterprise Gateway's launcher gets it
        # into the pod another way).
        "/bin/sh",
        "-c",
        'exec "$@" 3<"$0"',
        connection_file,
        "bwrap",
        "--ro-bind", "/", "/",
        "--perms", "0755", "--tmpfs", "/opt",
        "--ro-bind", str(image), IMAGE_VENV,
        *_interpreter_mounts(Path(sys.base_prefix).resolve()),
        "--remount-ro", "/opt",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "0755", "--tmpfs", "/run",
        "--perms", "0444", "--ro-bind-data", "3", CONNECTION_FILE,
        "--remount-ro", "/run",
        # The pod's emptyDir: writable by anyone, capped at its sizeLimit.
        "--perms", "0777", "--size", str(runtime.tmp_bytes), "--tmpfs", "/tmp",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent",
        "--clearenv", *setenv, "--setenv", "PATH", path,
        "--chdir", runtime.workdir,
        "--",
        "setpriv",
        f"--reuid={runtime.uid}",
        f"--regid={runtime.gid}",
        f"--groups={','.join(map(str, runtime.groups))}",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        # As uid 1000 now: a user namespace mapping uid and gid to themselves, in which no more can be made.
        "bwrap",
        "--unshare-user", "--uid", str(runtime.uid), "--gid", str(runtime.gid),
        "--disable-userns",
        "--bind", "/", "/",
        "--die-with-parent",
        "--",
        *command,
    ]  # fmt: skip


def write_kernelspec(kernels: Path, name: str, runtime: KernelRuntime, image: Path) -> None:
    """A kernelspec that runs ``image``'s kernel as the pod would, after checking the sandbox starts
    on this machine (a clear error here rather than a kernel the gateway restarts until it gives up)."""
    python = f"{IMAGE_VENV}/bin/python"
    check = subprocess.run(
        pod_argv(runtime, image, "/dev/null", [python, "-c", "pass"]), capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, f"the pod's sandbox does not start here: {check.stderr}"
    argv = pod_argv(runtime, image, "{connection_file}", [python, "-m", "ipykernel_launcher", "-f", CONNECTION_FILE])
    (kernels / name).mkdir(parents=True)
    (kernels / name / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))


@pytest.fixture(scope="module")
def runtime() -> KernelRuntime:
    return kernel_runtime()


@pytest.fixture(scope="module")
def pod_gateway(
    tmp_path_factory: pytest.TempPathFactory, ipybox_wheel: Path, runtime: KernelRuntime
) -> Iterator[Gateway]:
    """A Kernel Gateway whose kernelspecs run the image as a pod, and ones that run an image without
    ipybox and one with another ipybox_kernel."""
    root = tmp_path_factory.mktemp("kernel-image")
    image = make_image(root / "image", runtime, ipybox_wheel)
    # Not compiled (the first setup cell fails): its kernel imports ipykernel from source.
    broken = make_image(root / "image-without-ipybox", replace(runtime, compile=False), None)
    write_kernelspec(root / "jupyter" / "kernels", KERNEL_SPEC, runtime, image)
    write_kernelspec(root / "jupyter" / "kernels", KERNEL_SPEC_WITHOUT_IPYBOX, runtime, broken)
    other = other_ipybox(image, root / "image-other-ipybox")
    write_kernelspec(root / "jupyter" / "kernels", KERNEL_SPEC_OTHER_IPYBOX, runtime, other)
    with run_gateway(env={"JUPYTER_PATH": str(root / "jupyter")}) as gateway:
        yield gateway


@pytest.fixture(scope="module")
async def ex(pod_gateway: Gateway, tools_dir: Path, module_workspace: Path) -> AsyncGenerator[CodeExecutor]:
    kernel = GatewayKernel(pod_gateway.url, token=pod_gateway.token, kernel_name=KERNEL_SPEC, push_sources=False)
    timeouts = Timeouts(start=START_TIMEOUT)
    async with CodeExecutor(
        workspace=module_workspace, tools_dir=tools_dir, kernel=kernel, timeouts=timeouts
    ) as executor:
        yield executor
    assert pod_gateway.kernel_ids() == []


async def test_the_kernel_runs_code_on_the_images_ipybox_kernel_and_the_tool_modules_the_host_pushed(
    ex: CodeExecutor,
) -> None:
    assert (await ex.execute("1 + 1")).text == "2\n"
    code = (
        "import os, sys, ipybox_kernel, mcptools.test\n"
        "print(sys.prefix, ipybox_kernel.__file__, mcptools.test.__file__, os.environ['IPYBOX_TOOLS_DIR'])"
    )
    prefix, kernel_file, tools_file, tools_env = (await ex.execute(code)).text.split()
    assert prefix == IMAGE_VENV
    site = f"{IMAGE_VENV}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    assert kernel_file == f"{site}/ipybox_kernel/__init__.py"
    # The host's modules, pushed into the kernel's /tmp (the manifest never is).
    assert tools_file.startswith("/tmp/ipybox-") and tools_file.endswith("/mcptools/test/__init__.py")
    assert tools_env == tools_file.removesuffix("/test/__init__.py")
    listing = (await ex.execute(f"import os\nprint(sorted(os.listdir({tools_env!r})))")).text
    assert MANIFEST_DIR not in listing and "test" in listing


async def test_the_kernel_runs_as_uid_1000_with_no_capabilities_and_no_new_privileges(
    ex: CodeExecutor, runtime: KernelRuntime
) -> None:
    code = (
        "import os\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
        # uid_map shows the uid outside the kernel's namespace: the host's uid 1000, not root.
        "print(open('/proc/self/uid_map').read().split())\n"
        "status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "print({k: status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')})\n"
        "print({k: v for k, v in os.environ.items() if k in ('HOME', 'IPYTHONDIR', 'PYTHONDONTWRITEBYTECODE')})\n"
        "print(os.getcwd())"
    )
    ids, uid_map, status, env, cwd = (await ex.execute(code)).text.splitlines()
    uid, gid = runtime.uid, runtime.gid
    assert ids == f"{uid} {uid} {gid} {list(runtime.groups)}"
    assert uid_map == str([str(uid), str(uid), "1"])
    zero = "0000000000000000"
    caps = {"CapInh": zero, "CapPrm": zero, "CapEff": zero, "CapBnd": zero, "CapAmb": zero, "NoNewPrivs": "1"}
    assert status == str(caps)
    assert env == str({k: runtime.env[k] for k in ("HOME", "IPYTHONDIR", "PYTHONDONTWRITEBYTECODE")})
    assert cwd == runtime.workdir == "/tmp"


async def test_the_kernel_can_write_only_in_its_size_capped_tmp_and_cannot_make_a_user_namespace(
    ex: CodeExecutor, runtime: KernelRuntime
) -> None:
    code = (
        "import errno, os\n"
        "def write(path):\n"
        "    try:\n"
        "        with open(path, 'w') as f: f.write('x')\n"
        "        return 'written'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        f"print([write(p) for p in ('/x', '/etc/x', '{IMAGE_VENV}/x', '/usr/local/x', '/run/x', '/tmp/x')])\n"
        "st = os.statvfs('/tmp')\n"
        "print(st.f_blocks * st.f_frsize)\n"
        # Both IPython's directory and the kernel's own files are in /tmp.
        "print(os.path.isdir(os.environ['IPYTHONDIR']))\n"
        # unshare(CLONE_NEWUSER) in a process of its own: in the kernel's, which has threads, it always fails.
        "try_userns = 'import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); "
        "print(libc.unshare(0x10000000) == -1 and errno.errorcode[ctypes.get_errno()])'\n"
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', try_userns], capture_output=True, text=True).stdout.strip())"
    )
    writes, tmp_bytes, ipython_dir, unshare = (await ex.execute(code)).text.splitlines()
    assert writes == str(["EROFS"] * 5 + ["written"])
    assert int(tmp_bytes) == runtime.tmp_bytes
    assert ipython_dir == "True"
    assert unshare in ("ENOSPC", "EPERM")


async def test_an_approved_tool_call_from_the_images_module_returns_the_tools_result(ex: CodeExecutor) -> None:
    requests, result = await collect(ex, "from mcptools.test import greet\nprint(greet.run(greet.Params(name='pod')))")
    assert result.text == "Hello, pod!\n"
    [request] = requests
    assert (request.server_name, request.tool_name, dict(request.tool_args)) == ("test", "greet", {"name": "pod"})


async def test_a_rejected_tool_call_raises_tool_call_rejected_in_the_kernel(ex: CodeExecutor) -> None:
    [request], result = await collect(ex, CATCH_REJECTED, {"delete_item": False}, reason="not in a pod")
    assert request.tool_name == "delete_item" and result.text == "caught: not in a pod\n"


async def test_an_image_without_ipybox_fails_the_start_naming_the_missing_module(
    pod_gateway: Gateway, tools_dir: Path, workspace: Path
) -> None:
    kernel = GatewayKernel(
        pod_gateway.url, token=pod_gateway.token, kernel_name=KERNEL_SPEC_WITHOUT_IPYBOX, push_sources=False
    )
    before = set(pod_gateway.kernel_ids())
    timeouts = Timeouts(start=START_TIMEOUT)
    with anyio.fail_after(START_TIMEOUT), pytest.raises(KernelStartError) as info:
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=kernel, timeouts=timeouts) as executor:
            await executor.execute("1 + 1")
    message = str(info.value)
    assert "ModuleNotFoundError: No module named 'ipybox_kernel'" in message and "push_sources=False" in message
    # Not the setup cell, which the traceback quotes: it holds the executor's tool token.
    assert "IPYBOX_TOOL_TOKEN" not in message and "\x1b[" not in message
    # The kernel that could not be prepared was deleted on the gateway.
    assert set(pod_gateway.kernel_ids()) == before


async def test_an_image_with_another_ipybox_kernel_fails_the_start_naming_the_versions(
    pod_gateway: Gateway, tools_dir: Path, workspace: Path
) -> None:
    kernel = GatewayKernel(
        pod_gateway.url, token=pod_gateway.token, kernel_name=KERNEL_SPEC_OTHER_IPYBOX, push_sources=False
    )
    timeouts = Timeouts(start=START_TIMEOUT)
    with anyio.fail_after(START_TIMEOUT), pytest.raises(KernelStartError) as info:
        async with CodeExecutor(workspace=workspace, tools_dir=tools_dir, kernel=kernel, timeouts=timeouts) as executor:
            await executor.execute("1 + 1")
    message = str(info.value)
    host = f"ipybox {ipybox.__version__}"
    assert f"the kernel's ipybox_kernel ({host}, {IMAGE_VENV}/" in message
    assert f"is not the host's ({host}): install ipybox=={ipybox.__version__} in the kernel's image" in message

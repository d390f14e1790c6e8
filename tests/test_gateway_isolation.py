"""Kernels of one Kernel Gateway against each other (issue #25, class 7).

On a stock gateway every kernel runs as the gateway's user with its environment: one executor's
kernel reads another's connection file, connects with its key and reads its variables, and reads the
gateway's token from the gateway's command line. The host now asks each new kernel what it can see
and refuses it; with the shipped kernelspec (deploy/gateway/ipybox-sandboxed, a gateway on the ipc
transport) the same attack finds nothing and the kernel starts.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from deadline_support import patient
from servers.gateway import SANDBOXED, Gateway, run_sandboxed_gateway

from ipybox import CodeExecutor, ExecutionTimeout, GatewayKernel, KernelStartError, Timeouts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

# Two kernel starts on a loaded 2-core machine, one of them in a sandbox.
START_TIMEOUT = 60.0

# Kernel code of the attacker: the victim's connection file by its kernel id (only that one: other
# gateways on this machine share the runtime directory), then its `secret` through its own key; and
# every gateway token on a visible command line.
_ATTACK = """
import json, os
from jupyter_core.paths import jupyter_runtime_dir
path = os.path.join(jupyter_runtime_dir(), "kernel-{victim}.json")
stolen = None
if os.path.exists(path):
    from jupyter_client import BlockingKernelClient
    client = BlockingKernelClient(connection_file=path)
    client.load_connection_file()
    client.start_channels()
    msg_id = client.execute("", silent=True, user_expressions={{"s": "secret"}})
    while True:
        reply = client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    stolen = reply["content"]["user_expressions"]["s"]["data"]["text/plain"]
    client.stop_channels()
tokens = []
for pid in os.listdir("/proc"):
    try:
        args = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0") if pid.isdigit() else []
    except OSError:
        continue
    tokens += [a.split(b"=", 1)[1].decode() for a in args if a.startswith(b"--KernelGatewayApp.auth_token=")]
print(json.dumps({{"file": os.path.exists(path), "stolen": stolen, "tokens": tokens}}))
"""


def _kernel(gateway: Gateway, **options: object) -> GatewayKernel:
    return GatewayKernel(gateway.url, token=gateway.token, **options)  # pyright: ignore[reportArgumentType]


async def _attack(attacker: CodeExecutor, victim_id: str) -> dict[str, object]:
    result = await attacker.execute(_ATTACK.format(victim=victim_id))
    return json.loads(result.text)


@pytest.fixture(scope="module")
def sandboxed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A stock Kernel Gateway on the ipc transport with the shipped kernelspec installed, as docs/remote.md says."""
    with run_sandboxed_gateway(tmp_path_factory.mktemp("jupyter")) as gateway:
        yield gateway


async def test_on_a_stock_gateway_a_kernel_reads_anothers_variables_and_the_token_so_the_host_refuses_to_start(
    gateway: Gateway, tmp_path: Path
) -> None:
    timeouts = Timeouts(start=patient(START_TIMEOUT))
    trusting = _kernel(gateway, allow_unisolated_kernel=True)
    before = set(gateway.kernel_ids())
    with anyio.fail_after(timeouts.start * 4):
        async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=trusting, timeouts=timeouts) as victim:
            await victim.execute("secret = 'victim-42'")
            [victim_id] = set(gateway.kernel_ids()) - before
            # The attack, reproduced with the check turned off.
            async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=trusting, timeouts=timeouts) as attacker:
                seen = await _attack(attacker, victim_id)
            assert seen["stolen"] == "'victim-42'"
            assert gateway.token in cast_list(seen["tokens"])

            # By default the host refuses such a kernel, before anything of its own reaches it.
            with pytest.raises(KernelStartError) as refused:
                async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=_kernel(gateway), timeouts=timeouts):
                    pass
    message = str(refused.value)
    assert "not isolated from the gateway's other kernels" in message, message
    # The message names a few files; the victim's is one of them unless other kernels' came first.
    listed = re.search(r"read (\d+) other kernels' connection files", message)
    assert listed is not None, message
    assert f"kernel-{victim_id}.json" in message or int(listed.group(1)) > 3, message
    assert "token on the command line" in message, message
    assert "deploy/gateway/ipybox-sandboxed" in message and "allow_unisolated_kernel=True" in message, message
    assert gateway.token not in message
    assert set(gateway.kernel_ids()) == before, "the refused kernel was deleted"


async def test_with_the_sandboxed_kernelspec_the_attack_finds_nothing_and_kernels_start(
    sandboxed_gateway: Gateway, tmp_path: Path
) -> None:
    kernel = _kernel(sandboxed_gateway, kernel_name=SANDBOXED)
    timeouts = Timeouts(start=patient(START_TIMEOUT))
    # A root-only secret in /etc (the gateway runs as root here, so its kernels read as root).
    planted = Path(f"/etc/ipybox-gateway-secret-{secrets.token_hex(4)}")
    planted.write_text("gateway-secret")
    planted.chmod(0o600)
    try:
        await _attack_sandboxed(sandboxed_gateway, kernel, timeouts, tmp_path, planted)
    except BaseException:
        print(f"the gateway's log ends with:\n{sandboxed_gateway.log_tail()}")
        raise
    finally:
        planted.unlink()
    assert sandboxed_gateway.kernel_ids() == []


async def _attack_sandboxed(
    sandboxed_gateway: Gateway, kernel: GatewayKernel, timeouts: Timeouts, tmp_path: Path, planted: Path
) -> None:
    with anyio.fail_after(timeouts.start * 4):
        async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=kernel, timeouts=timeouts) as victim:
            await victim.execute("secret = 'victim-42'")
            [victim_id] = sandboxed_gateway.kernel_ids()
            async with CodeExecutor(workspace=tmp_path, tools_dir=None, kernel=kernel, timeouts=timeouts) as attacker:
                seen = await _attack(attacker, victim_id)
                assert seen == {"file": False, "stolen": None, "tokens": []}
                looked = await attacker.execute(
                    "import os\n"
                    "print(sorted(p for p in os.listdir('/proc') if p.isdigit()), "
                    "sorted(k for k in os.environ if 'TOKEN' in k and k != 'IPYBOX_TOOL_TOKEN'), os.listdir('/run'))"
                )
                # Its own processes only (the sandbox's init and the kernel), no token variable, no runtime dir.
                assert looked.text == "['1', '2'] [] ['ipybox']\n", looked.text
                # /etc's secrets are empty: the shadow file and what is readable by root alone.
                read = await attacker.execute(f"print([len(open(p).read()) for p in ('/etc/shadow', '{planted}')])")
                assert read.text == "[0, 0]\n", read.text
            # Interrupts are messages to a kernel in a session of its own: a timeout keeps the kernel's state.
            with pytest.raises(ExecutionTimeout) as timed_out:
                await victim.execute("import threading\nthreading.Event().wait()", timeout=2)
            assert not timed_out.value.restarted
            assert (await victim.execute("print(secret)")).text == "victim-42\n"


def cast_list(value: object) -> list[object]:
    assert isinstance(value, list)
    return list(value)  # pyright: ignore[reportUnknownArgumentType]

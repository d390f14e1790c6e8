"""`CodeExecutor.upload` and ``download`` with a kernel on a real Jupyter Kernel Gateway on 127.0.0.1:
the contract of the local versions, and a kernel that breaks the transfer on purpose (kernel code can
replace ``ipybox_kernel._files.serve``, which answers the host's requests).

The round trip of files of every kind is in tests/test_conformance.py, on both backends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import pytest
from memory_support import reset_resident_peak, resident, resident_peak
from servers.gateway import Gateway

from ipybox import CodeExecutor, FileTransferError, GatewayKernel, KernelConnectionLost, Limits, UsageError

pytestmark = pytest.mark.anyio

# A small output limit makes the host's message limit small, and a download's chunks with it.
OUTPUT_CHARS = 20_000
# Seconds the kernel gets per request in these tests (the default is a minute).
TRANSFER_TIMEOUT = 5.0
# Deadline for what must end on its own: a transfer the kernel stalls, a kernel restart.
RECOVERY = 60.0
# How much more memory the host may use while a transfer runs: a chunk or two (1 MiB, its base64
# and JSON), the websocket's queue of a few messages, and the allocator's slack.
TRANSFER_MEMORY_GROWTH = 40 * 1024**2
STREAMED = 50 * 1024**2
# Replaces the kernel's side of transfers with ``hostile(op, tid, *args)`` (defined by the test's code).
PATCH = "import ipybox_kernel._files as files\nreal_serve = files.serve\nfiles.serve = hostile\n"


@pytest.fixture
async def remote(gateway: Gateway, workspace: Path) -> AsyncGenerator[CodeExecutor]:
    """A fresh executor on the gateway per test: hostile tests replace its kernel's side of transfers."""
    kernel = GatewayKernel(
        gateway.url, token=gateway.token, transfer_timeout=TRANSFER_TIMEOUT, allow_unisolated_kernel=True
    )
    before = set(gateway.kernel_ids())
    async with CodeExecutor(
        workspace=workspace, tools_dir=None, kernel=kernel, limits=Limits(output_chars=OUTPUT_CHARS)
    ) as ex:
        yield ex
    # Every kernel the executor started is gone from the gateway, the ones it replaced included.
    assert not set(gateway.kernel_ids()) - before


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """Where downloads go, holding an older ``dst.bin`` that a failed download must leave as it was."""
    path = tmp_path / "host"
    path.mkdir()
    (path / "dst.bin").write_bytes(b"old")
    return path


def untouched(host_dir: Path) -> bool:
    """The download destination kept its old content, and no partial copy is left beside it."""
    return [p.name for p in host_dir.iterdir()] == ["dst.bin"] and (host_dir / "dst.bin").read_bytes() == b"old"


async def still_works(ex: CodeExecutor) -> str:
    with anyio.fail_after(RECOVERY):
        return (await ex.execute("print('works')")).text


# -- the contract of the local versions ----------------------------------------------------------


async def test_a_file_larger_than_max_bytes_is_refused_by_its_announced_size(
    remote: CodeExecutor, host_dir: Path
) -> None:
    await remote.execute("open('big.bin', 'wb').write(bytes(100_000))")
    with pytest.raises(UsageError) as info:
        await remote.download("big.bin", host_dir / "dst.bin", max_bytes=1000)
    message = str(info.value)
    assert "is 100000 bytes, more than the limit of 1000 bytes" in message and "max_bytes" in message
    assert untouched(host_dir)


async def test_a_file_the_kernel_grows_during_the_download_stops_at_max_bytes(
    remote: CodeExecutor, host_dir: Path
) -> None:
    # Before each chunk is read, the file grows by more than a chunk: the download never catches up.
    code = (
        "open('grows.bin', 'wb').write(bytes(1000))\n"
        "def hostile(op, *args):\n"
        "    if op == 'read':\n"
        "        open('grows.bin', 'ab').write(bytes(300_000))\n"
        "    return real_serve(op, *args)\n"
    )
    await remote.execute(code + PATCH)
    with anyio.fail_after(RECOVERY), pytest.raises(UsageError) as info:
        await remote.download("grows.bin", host_dir / "dst.bin", max_bytes=2_000_000)
    assert "grew past 2000000 bytes while it was read" in str(info.value)
    assert untouched(host_dir)
    assert await still_works(remote) == "works\n"


async def test_paths_that_leave_the_working_directory_are_refused_before_the_kernel_is_asked(
    remote: CodeExecutor, tmp_path: Path, host_dir: Path
) -> None:
    src = tmp_path / "src.txt"
    src.write_text("x")
    for path in ("../outside.txt", "a/../../outside.txt", "/etc/hostname", "", "."):
        with pytest.raises(UsageError, match=r"absolute|inside the kernel's working directory"):
            await remote.upload(src, path)
        with pytest.raises(UsageError, match=r"absolute|inside the kernel's working directory"):
            await remote.download(path, host_dir / "dst.bin")
    assert untouched(host_dir)


async def test_symlinks_in_the_kernels_working_directory_are_not_followed(
    remote: CodeExecutor, tmp_path: Path, host_dir: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the host")
    src = tmp_path / "src.txt"
    src.write_text("uploaded")
    await remote.execute(
        f"import os\nos.symlink({str(outside)!r}, 'escape')\nos.symlink({str(outside / 'secret.txt')!r}, 'link.txt')"
    )
    with pytest.raises(UsageError, match="is a symlink; ipybox does not follow it"):
        await remote.download("link.txt", host_dir / "dst.bin")
    for path in ("escape/secret.txt", "escape/new.txt"):
        with pytest.raises(UsageError, match="a directory on its way is a symlink"):
            await remote.download(path, host_dir / "dst.bin")
        with pytest.raises(UsageError, match="a directory on its way is a symlink"):
            await remote.upload(src, path)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    # Uploading onto a symlink replaces the link, not the file it points to (as locally).
    await remote.upload(src, "link.txt")
    result = await remote.execute("import os\nprint(os.path.islink('link.txt'), open('link.txt').read())")
    assert result.text == "False uploaded\n"
    assert (outside / "secret.txt").read_text() == "not for the host"
    assert untouched(host_dir)


async def test_only_regular_files_that_exist_are_downloaded(remote: CodeExecutor, host_dir: Path) -> None:
    await remote.execute("import os\nos.mkdir('folder')\nos.mkfifo('pipe')")
    for path in ("folder", "pipe"):
        with pytest.raises(UsageError, match="is not a regular file"):
            await remote.download(path, host_dir / "dst.bin")
    with pytest.raises(UsageError, match="does not exist"):
        await remote.download("missing.bin", host_dir / "dst.bin")
    assert untouched(host_dir)


async def test_a_failure_of_the_kernels_file_system_names_the_error(remote: CodeExecutor, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("x")
    with pytest.raises(FileTransferError, match="File name too long") as info:
        await remote.upload(src, "x" * 300)
    assert info.value.path == "x" * 300 and not info.value.restarted
    assert (await remote.execute("import os\nprint([n for n in os.listdir() if 'ipybox' in n])")).text == "[]\n"


async def test_files_of_tens_of_megabytes_stream_through_bounded_host_memory(
    remote: CodeExecutor, tmp_path: Path
) -> None:
    src, back = tmp_path / "src.bin", tmp_path / "back.bin"
    with src.open("wb") as f:
        f.truncate(STREAMED)
        f.write(b"head")
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(RECOVERY):
        await remote.upload(src, "large.bin")
        await remote.download("large.bin", back, max_bytes=None)
    assert resident_peak() - before < TRANSFER_MEMORY_GROWTH
    assert back.stat().st_size == STREAMED
    with back.open("rb") as f:
        assert f.read(4) == b"head"


# -- a kernel that breaks the transfer -----------------------------------------------------------

# Each replaces `serve` for the download of a 1 MB file, and the FileTransferError's reason it must cause.
BROKEN = {
    "forged answer": ("def hostile(op, *args):\n    return 'it is all \"fine\"'\n", "does not have the form"),
    "a reply that raises": ("def hostile(op, *args):\n    raise RuntimeError('no')\n", "RuntimeError: no"),
    "a chunk longer than asked for": (
        "import base64\n"
        "def hostile(op, tid, *args):\n"
        "    if op == 'read':\n"
        "        offset, size = args\n"
        "        return f'ok {offset} ' + base64.b64encode(bytes(size + 3000)).decode()\n"
        "    return real_serve(op, tid, *args)\n",
        "more than the",
    ),
    "a chunk out of order": (
        "def hostile(op, tid, *args):\n"
        "    if op == 'read':\n"
        "        offset, size = args\n"
        "        return real_serve(op, tid, offset + size, size) if offset else real_serve(op, tid, *args)\n"
        "    return real_serve(op, tid, *args)\n",
        "at offset",
    ),
    "many messages instead of a reply": (
        # Until interrupted: IOPub messages and the reply reach the host on two channels, so a
        # burst followed by a reply could be overtaken by it.
        "def hostile(op, *args):\n"
        "    k = get_ipython().kernel\n"
        "    try:\n"
        "        while True:\n"
        "            k.session.send(k.iopub_socket, 'status', {'execution_state': 'busy'}, parent=k.get_parent())\n"
        "    except KeyboardInterrupt:\n"
        "        return 'interrupted'\n",
        "many messages",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
async def test_a_kernel_that_breaks_the_download_fails_it_with_a_clear_error(
    remote: CodeExecutor, host_dir: Path, case: str
) -> None:
    code, reason = BROKEN[case]
    await remote.execute("open('file.bin', 'wb').write(bytes(1_000_000))\n" + code + PATCH)
    with anyio.fail_after(RECOVERY), pytest.raises(FileTransferError) as info:
        await remote.download("file.bin", host_dir / "dst.bin")
    assert reason in info.value.reason and info.value.path == "file.bin"
    assert untouched(host_dir)
    assert await still_works(remote) == "works\n"


async def test_a_kernel_that_announces_a_small_file_and_sends_without_end_is_stopped_at_max_bytes(
    remote: CodeExecutor, host_dir: Path
) -> None:
    code = (
        "import base64\n"
        "def hostile(op, tid, *args):\n"
        "    if op == 'open_read':\n"
        "        return 'ok 10'\n"
        "    if op == 'read':\n"
        "        offset, size = args\n"
        "        return f'ok {offset} ' + base64.b64encode(bytes(size)).decode()\n"
        "    return 'ok'\n"
    )
    await remote.execute(code + PATCH)
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(RECOVERY), pytest.raises(UsageError) as info:
        await remote.download("anything.bin", host_dir / "dst.bin", max_bytes=20 * 1024**2)
    assert resident_peak() - before < TRANSFER_MEMORY_GROWTH
    assert f"grew past {20 * 1024**2} bytes" in str(info.value)
    assert untouched(host_dir)


async def test_a_reply_over_the_message_limit_drops_the_kernel_not_the_host(
    remote: CodeExecutor, host_dir: Path
) -> None:
    code = "def hostile(op, *args):\n    return 'ok 0 ' + 'A' * 50_000_000\n"
    await remote.execute("kept = 1\n" + code + PATCH)
    reset_resident_peak()
    before = resident()
    with anyio.fail_after(RECOVERY), pytest.raises(KernelConnectionLost, match="too big"):
        await remote.download("file.bin", host_dir / "dst.bin")
    assert resident_peak() - before < TRANSFER_MEMORY_GROWTH
    assert untouched(host_dir)
    # A fresh kernel, with no state and the real `serve`.
    with anyio.fail_after(RECOVERY):
        assert (await remote.execute("print('kept' in globals())")).text == "False\n"


async def test_a_kernel_that_stalls_a_transfer_is_interrupted_and_keeps_its_state(
    remote: CodeExecutor, host_dir: Path
) -> None:
    code = "import threading\ndef hostile(op, *args):\n    threading.Event().wait()\n"
    await remote.execute("kept = 1\n" + code + PATCH)
    with anyio.fail_after(RECOVERY), pytest.raises(FileTransferError) as info:
        await remote.download("file.bin", host_dir / "dst.bin")
    assert f"did not answer a request within {TRANSFER_TIMEOUT:g} s" in info.value.reason
    assert not info.value.restarted
    assert untouched(host_dir)
    with anyio.fail_after(RECOVERY):
        assert (await remote.execute("print(kept)")).text == "1\n"


async def test_a_kernel_that_stalls_a_transfer_through_interrupts_is_restarted(
    remote: CodeExecutor, tmp_path: Path
) -> None:
    code = (
        "import threading\n"
        "def hostile(op, *args):\n"
        "    while True:\n"
        "        try:\n"
        "            threading.Event().wait()\n"
        "        except KeyboardInterrupt:\n"
        "            pass\n"
    )
    src = tmp_path / "src.txt"
    src.write_text("x")
    await remote.execute(code + PATCH)
    with anyio.fail_after(RECOVERY), pytest.raises(FileTransferError) as info:
        await remote.upload(src, "dst.txt")
    assert info.value.restarted and "restarted" in str(info.value)
    assert await still_works(remote) == "works\n"
    with anyio.fail_after(RECOVERY):
        # The fresh kernel has the real `serve` again.
        await remote.upload(src, "dst.txt")


def test_transfer_timeout_must_be_positive() -> None:
    with pytest.raises(UsageError, match="transfer_timeout must be a positive number"):
        GatewayKernel("http://127.0.0.1:9", transfer_timeout=0)


async def test_install_stays_refused_for_a_remote_kernel_with_the_image_as_the_fix(remote: CodeExecutor) -> None:
    with pytest.raises(UsageError, match="install packages in the kernel's image"):
        await remote.install("six")

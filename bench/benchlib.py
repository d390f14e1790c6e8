"""The workload both sides of the benchmark run, and the measuring helpers they share.

This module is imported by `side_ours.py` (this repository's venv) and by `side_peer.py` (the
throwaway ipybox 0.9.2 venv), so it may only use the standard library and anyio, which both venvs
have. Each side supplies a `Side` adapter; everything that decides *what* is measured lives here,
so the two columns of the table come from the same code.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anyio

__all__ = (
    "BENCH_SERVER",
    "EVERYTHING_SERVER",
    "Config",
    "DirectCall",
    "Side",
    "descendants",
    "find_kernel",
    "main",
    "rss_mb",
    "run_side",
    "summarize",
)

BENCH_SERVER = "benchsrv"
EVERYTHING_SERVER = "everything"

# Deadline for one execute() of the workload; a hung executor must end the run, not stall it.
EXEC_TIMEOUT = 120.0
# Deadline for generate_mcp_sources of one server (npx-free, locally installed servers).
GENERATE_TIMEOUT = 120.0
# A kernel-side read-back whose output was lost (ipybox 0.9.2's race) is asked again this often.
READBACK_ATTEMPTS = 20

Metric = dict[str, Any]
"""One measured quantity: {"unit", "median", "n", "min", "p95", "max", ...} or {"na": reason}."""


@dataclass(frozen=True)
class Config:
    """How much of each workload to run."""

    starts: int = 20
    # A side with several sandbox variants starts each this many times instead, when larger: one
    # start varies by tens of ms, and their difference needs many pairs to settle.
    paired_starts: int = 60
    warmup: int = 20
    executes: int = 200
    lost_runs: int = 1000
    tool_calls: int = 100
    seq_calls: int = 200
    # Each rep is one 200-call cell and 200 direct calls; their ratio is taken pair by pair (see
    # run.py's floor_ratios), and a loaded machine needs more pairs than 7 for it to settle.
    seq_reps: int = 15
    generate_reps: int = 3
    server_python: str = sys.executable
    everything_bin: str | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> Config:
        """A reduced configuration that finishes in about two minutes for both sides."""
        base = cls(
            starts=3,
            paired_starts=3,
            warmup=10,
            executes=200,
            lost_runs=300,
            tool_calls=100,
            seq_reps=3,
            generate_reps=1,
        )
        return cls(**(asdict(base) | overrides))


class Side(Protocol):
    """What one implementation under test has to provide."""

    name: str
    version: str

    @property
    def sandbox_variants(self) -> tuple[str, ...]:
        """Names of sandbox settings to time start->ready for; the first is the default."""
        ...

    @property
    def mcp_unavailable(self) -> str | None:
        """Why MCP metrics cannot be measured on this side, or None when they can."""
        ...

    def executor(self, work: Path, *, sandbox: str, tools: bool) -> AbstractAsyncContextManager[object]:
        """An unentered executor; entering it is what start->ready times."""
        ...

    async def execute(self, executor: object, code: str) -> str | None:
        """Run code and return its text output (None when the executor returned none)."""
        ...

    async def generate(self, server: str, params: dict[str, Any], root: Path) -> list[str]:
        """Generate typed modules for one MCP server under root/<server>/."""
        ...


class DirectCall(Protocol):
    """Calls ``add(i, 1)`` on the bench server straight from the host; returns whether it gave ``i + 1``."""

    def __call__(self, i: int) -> Awaitable[bool]: ...


class _DirectSession(Protocol):
    """Optional `Side.direct_session`: a session with the bench server in the side's own process,
    no executor in between, for the floor the kernel's tool calls are measured against."""

    def __call__(self, params: dict[str, Any]) -> AbstractAsyncContextManager[DirectCall]: ...


class _Breakdown(Protocol):
    """Optional `Side.generation_breakdown`: the phases of one generation in ms."""

    def __call__(self, server: str, params: dict[str, Any], root: Path) -> Awaitable[dict[str, float]]: ...


def summarize(samples: list[float], *, unit: str = "ms", scale: float = 1000.0, **extra: Any) -> Metric:
    """Median, n, min, p95 and max of samples (seconds by default, reported in ms)."""
    if not samples:
        return {"na": "no samples", **extra}
    xs = sorted(x * scale for x in samples)
    p95 = statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) >= 2 else xs[0]
    return {
        "unit": unit,
        "median": round(statistics.median(xs), 4),
        "n": len(xs),
        "min": round(xs[0], 4),
        "p95": round(p95, 4),
        "max": round(xs[-1], 4),
        **extra,
        # In measurement order, for looking at distributions (kernel start is bimodal, for one).
        "samples": [round(x * scale, 4) for x in samples],
    }


def scalar(value: float, *, unit: str, n: int = 1, **extra: Any) -> Metric:
    """A single measured value in the same shape as `summarize` gives."""
    v = round(value, 4)
    return {"unit": unit, "median": v, "n": n, "min": v, "p95": v, "max": v, **extra}


# --- processes via /proc (psutil is not a dependency of ours) -------------------------------------


def _children_via_task_files(pid: int) -> list[int] | None:
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        try:
            children.extend(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:
            # Kernels without CONFIG_PROC_CHILDREN have no such file at all.
            return None
        except OSError:
            continue
    return children


def _parent_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name in field 2 may contain spaces and parentheses; fields resume after the last ")".
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, depth) of every live descendant of pid, parents before children."""
    out: list[tuple[int, int]] = []
    parent_map: dict[int, list[int]] | None = None
    stack = [(pid, 0)]
    while stack:
        cur, depth = stack.pop()
        kids = _children_via_task_files(cur)
        if kids is None:
            parent_map = parent_map if parent_map is not None else _parent_map()
            kids = parent_map.get(cur, [])
        for kid in kids:
            out.append((kid, depth + 1))
            stack.append((kid, depth + 1))
    return out


def tree_cpu_ns(pid: int) -> int:
    """CPU time in ns of every thread of every live descendant of pid (``schedstat``'s first field)."""
    total = 0
    for child, _ in descendants(pid):
        try:
            tasks = list(Path(f"/proc/{child}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total


def rss_mb(pid: int) -> float | None:
    """VmRSS of pid in MB, or None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def process_table() -> list[dict[str, Any]]:
    """Every descendant of this process with its RSS and command line (for the JSON record)."""
    rows: list[dict[str, Any]] = []
    for pid, depth in descendants(os.getpid()):
        rss = rss_mb(pid)
        if rss is None:
            continue
        rows.append({"pid": pid, "depth": depth, "rss_mb": round(rss, 1), "cmd": " ".join(_cmdline(pid))[:200]})
    return rows


_KERNEL_MARKERS = ("ipykernel", "ipybox_kernel")


def find_kernel() -> tuple[int, str] | None:
    """The IPython kernel among this process's descendants: (pid, command line).

    The kernel is the deepest descendant whose command line names ipykernel or ipybox_kernel and
    that is not a sandbox wrapper (bwrap's own argv carries the kernel command too).
    """
    best: tuple[int, int, str] | None = None
    for pid, depth in descendants(os.getpid()):
        argv = _cmdline(pid)
        if not argv or Path(argv[0]).name == "bwrap":
            continue
        cmd = " ".join(argv)
        if any(m in cmd for m in _KERNEL_MARKERS) and (best is None or depth > best[1]):
            best = (pid, depth, cmd)
    return None if best is None else (best[0], best[2][:200])


def kernel_rss(label: str) -> Metric:
    """RSS of the kernel process right now."""
    found = find_kernel()
    if found is None:
        return {"na": f"no kernel process found among descendants ({label})", "processes": process_table()}
    pid, cmd = found
    rss = rss_mb(pid)
    if rss is None:
        return {"na": f"kernel process {pid} vanished ({label})"}
    return scalar(rss, unit="MB", pid=pid, cmd=cmd, processes=process_table())


# --- the workload -------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class _Run:
    side: Side
    cfg: Config
    work: Path
    metrics: dict[str, Metric] = field(default_factory=dict[str, Metric])
    errors: dict[str, str] = field(default_factory=dict[str, str])

    @contextmanager
    def guard(self, group: str, *names: str) -> Generator[None]:
        """Top-level handler for one metric group: a broken metric must not lose the others."""
        try:
            yield
        except Exception as exc:  # top level of a metric group, by design
            detail = "".join(traceback.format_exception_only(exc)).strip()
            self.errors[group] = detail
            _log(f"{group} FAILED: {detail}")
            traceback.print_exc(file=sys.stderr)
            for name in names:
                self.metrics.setdefault(name, {"na": f"error: {detail[:200]}"})

    async def run(self, ex: object, code: str) -> str | None:
        with anyio.fail_after(EXEC_TIMEOUT):
            return await self.side.execute(ex, code)

    async def readback(self, ex: object, expr: str) -> Any:
        """Value of a kernel expression that was built up by earlier cells.

        The expression is printed as JSON. An empty answer is asked again, because ipybox 0.9.2
        sometimes drops output; the value is in the kernel's state, so asking again is harmless.
        """
        for _ in range(READBACK_ATTEMPTS):
            text = await self.run(ex, f"import json as _bj\nprint(_bj.dumps({expr}))")
            if text:
                return json.loads(text)
        raise RuntimeError(f"no output for {expr!r} after {READBACK_ATTEMPTS} attempts")


# Entering and leaving executors is not wrapped in a cancel scope: an executor's __aenter__ opens a
# task group that must outlive it. Both executors bound their own start-up; the runner bounds a side.


async def _timed_enter(cm: AbstractAsyncContextManager[object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    ex = await cm.__aenter__()
    return ex, time.perf_counter() - t0


async def _timed_exit(cm: AbstractAsyncContextManager[object]) -> float:
    t0 = time.perf_counter()
    await cm.__aexit__(None, None, None)
    return time.perf_counter() - t0


@asynccontextmanager
async def _entered(cm: AbstractAsyncContextManager[object]) -> AsyncGenerator[tuple[object, float]]:
    ex, elapsed = await _timed_enter(cm)
    try:
        yield ex, elapsed
    finally:
        await _timed_exit(cm)


async def _starts(r: _Run) -> None:
    """start->ready and stop of fresh executors, for every sandbox variant the side has.

    The variants take turns start by start, in ABBA order, so a change in machine load (or a cache
    warmed by the start before) hits them alike and the sandbox overhead (their difference) is not
    an artefact of when each was measured.
    """
    variants = r.side.sandbox_variants
    rounds = r.cfg.starts if len(variants) == 1 else max(r.cfg.starts, r.cfg.paired_starts)
    keys = {v: "" if v == variants[0] else f"_{v}" for v in variants}
    starts: dict[str, list[float]] = {v: [] for v in variants}
    # CPU spent until ready by this process and by the executor's processes (sandbox and kernel):
    # a second view of the same starts that leaves out waiting (wake-ups, I/O). It is no steadier
    # on this VM (the day's runs spread over about 25 ms), but it shows where the cost is work.
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    stops: dict[str, list[float]] = {v: [] for v in variants}
    first_wrong: dict[str, list[str | None]] = {v: [] for v in variants}
    for i in range(rounds):
        for variant in variants if i % 2 == 0 else variants[::-1]:
            if f"start{keys[variant]}" in r.errors:
                continue
            with r.guard(f"start{keys[variant]}"):
                cm = r.side.executor(r.work, sandbox=variant, tools=False)
                cpu0 = time.process_time_ns()
                ex, elapsed = await _timed_enter(cm)
                cpu = time.process_time_ns() - cpu0 + tree_cpu_ns(os.getpid())
                starts[variant].append(elapsed)
                cpus[variant].append(cpu / 1e9)
                # Proves the executor was really ready; not timed.
                text = await r.run(ex, "1+1")
                if _stripped(text) != "2":
                    first_wrong[variant].append(text)
                stops[variant].append(await _timed_exit(cm))
                _log(f"start[{variant}] {i + 1}/{rounds}: {elapsed * 1000:.0f} ms")
    for variant in variants:
        error = r.errors.get(f"start{keys[variant]}")
        na: Metric = {"na": f"error: {error[:200]}"} if error else {"na": "no samples"}
        if error or not starts[variant]:
            r.metrics[f"start_ready{keys[variant]}"] = r.metrics[f"stop{keys[variant]}"] = na
            continue
        r.metrics[f"start_ready{keys[variant]}"] = summarize(
            starts[variant], sandbox=variant, first_execute_wrong=first_wrong[variant]
        )
        r.metrics[f"stop{keys[variant]}"] = summarize(stops[variant], sandbox=variant)
    if len(variants) > 1:
        with_sb = r.metrics["start_ready"]
        without = r.metrics[f"start_ready_{variants[1]}"]
        if "median" in with_sb and "median" in without:
            # Starts alternate, so each sandboxed start has an unsandboxed neighbour taken under the
            # same load: the median of those differences is steadier than the difference of medians.
            pairs = [a - b for a, b in zip(starts[variants[0]], starts[variants[1]], strict=False)]
            cpu_pairs = [a - b for a, b in zip(cpus[variants[0]], cpus[variants[1]], strict=False)]
            r.metrics["sandbox_overhead_cpu"] = scalar(
                statistics.median(cpu_pairs) * 1000,
                unit="ms",
                n=len(cpu_pairs),
                sandboxed_cpu_median_ms=round(statistics.median(cpus[variants[0]]) * 1000, 4),
                unsandboxed_cpu_median_ms=round(statistics.median(cpus[variants[1]]) * 1000, 4),
            )
            r.metrics["sandbox_overhead"] = scalar(
                statistics.median(pairs) * 1000,
                unit="ms",
                n=len(pairs),
                sandboxed_median_ms=with_sb["median"],
                unsandboxed_median_ms=without["median"],
                difference_of_medians_ms=round(with_sb["median"] - without["median"], 4),
                min_difference_ms=round(with_sb["min"] - without["min"], 4),
            )
        else:
            r.metrics["sandbox_overhead"] = r.metrics["sandbox_overhead_cpu"] = {"na": "a start variant failed"}


def _server_params(r: _Run) -> dict[str, dict[str, Any]]:
    servers = {
        BENCH_SERVER: {
            "command": r.cfg.server_python,
            "args": [str(Path(__file__).with_name("bench_mcp_server.py"))],
        }
    }
    if r.cfg.everything_bin is not None:
        servers[EVERYTHING_SERVER] = {"command": r.cfg.everything_bin, "args": ["stdio"]}
    return servers


async def _generation(r: _Run) -> bool:
    """generate_mcp_sources per server; returns whether the bench server's tools are ready."""
    ready = False
    if r.cfg.everything_bin is None:
        r.metrics[f"generate_{EVERYTHING_SERVER}"] = {"na": "node_modules/.bin/mcp-server-everything not installed"}
    for server, params in _server_params(r).items():
        name = f"generate_{server}"
        with r.guard(name, name):
            times: list[float] = []
            tools: list[str] = []
            for _ in range(r.cfg.generate_reps):
                t0 = time.perf_counter()
                with anyio.fail_after(GENERATE_TIMEOUT):
                    tools = await r.side.generate(server, params, r.work / "mcptools")
                times.append(time.perf_counter() - t0)
            r.metrics[name] = summarize(times, tools=len(tools), first_ms=round(times[0] * 1000, 1))
            breakdown: object = getattr(r.side, "generation_breakdown", None)
            if callable(breakdown):
                # One more, untimed generation, for where the time goes (connect, list, generate, write).
                with anyio.fail_after(GENERATE_TIMEOUT):
                    phases = await cast(_Breakdown, breakdown)(server, params, r.work / "mcptools")
                r.metrics[name]["breakdown_ms"] = phases
            _log(f"{name}: {len(tools)} tools, median {r.metrics[name]['median']:.0f} ms")
            ready = ready or server == BENCH_SERVER
    return ready


def _stripped(text: str | None) -> str | None:
    # Surrounding whitespace is formatting, not loss: ours keeps print's newline, 0.9.2 strips it.
    return None if text is None else text.strip()


async def _executes(r: _Run, ex: object) -> None:
    with r.guard("execute_1plus1", "execute_1plus1"):
        for _ in range(r.cfg.warmup):
            await r.run(ex, "1+1")
        times: list[float] = []
        wrong = 0
        texts: set[str | None] = set()
        for _ in range(r.cfg.executes):
            t0 = time.perf_counter()
            text = await r.run(ex, "1+1")
            times.append(time.perf_counter() - t0)
            texts.add(text)
            wrong += _stripped(text) != "2"
        # The exact texts seen are recorded: the two sides format "2" differently.
        r.metrics["execute_1plus1"] = summarize(times, wrong_results=wrong, texts_seen=sorted(map(repr, texts)))
        _log(f"execute('1+1'): median {r.metrics['execute_1plus1']['median']:.2f} ms, {wrong} wrong")

    with r.guard("lost_outputs", "lost_outputs"):
        lost: list[tuple[int, str | None]] = []
        for i in range(r.cfg.lost_runs):
            text = await r.run(ex, f"print({i})")
            if _stripped(text) != str(i):
                lost.append((i, text))
        r.metrics["lost_outputs"] = scalar(len(lost), unit="lost", n=r.cfg.lost_runs, examples=lost[:10])
        _log(f"lost outputs: {len(lost)}/{r.cfg.lost_runs}")


_CALL = "_bench_add.run(_bench_add.Params(a={a}, b=1))"
# One call is timed inside one function, i.e. one statement of the cell: IPython runs each top-level
# statement of a cell on its own (compiled, then run through its run_code), and on this VM the step
# from one to the next costs 0.1-0.3 ms in a plain ipykernel too, which a timer spanning statements
# would charge to the call.
_IMPORT = (
    f"import time as _bench_time\nfrom mcptools.{BENCH_SERVER} import add as _bench_add\n"
    "_bench_calls = []\n_bench_ok = []\n_bench_seq = []\n"
    "def _bench_one(a):\n"
    "    t0 = _bench_time.perf_counter()\n"
    f"    r = {_CALL.format(a='a')}\n"
    "    _bench_calls.append(_bench_time.perf_counter() - t0)\n"
    "    _bench_ok.append(r.result == a + 1)\n"
)


async def _tool_calls(r: _Run, ex: object) -> None:
    with r.guard("kernel_rss_after_tool_import", "kernel_rss_after_tool_import"):
        await r.run(ex, _IMPORT)
        r.metrics["kernel_rss_after_tool_import"] = kernel_rss("after first tool import")

    opener: object = getattr(r.side, "direct_session", None)
    if callable(opener):
        # The floor, taking turns with the kernel's calls so that both see the same machine.
        async with cast(_DirectSession, opener)(_server_params(r)[BENCH_SERVER]) as direct:
            await _kernel_calls(r, ex, direct)
    else:
        await _kernel_calls(r, ex, None)

    with r.guard("kernel_rss_after_tool_calls", "kernel_rss_after_tool_calls"):
        r.metrics["kernel_rss_after_tool_calls"] = kernel_rss("after tool calls")

    if r.cfg.everything_bin is not None:
        await _everything_calls(r, ex)


async def _direct_loop(direct: DirectCall, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    ok = 0
    for i in range(n):
        ok += await direct(i)
    return time.perf_counter() - t0, ok


async def _kernel_calls(r: _Run, ex: object, direct: DirectCall | None) -> None:
    """The bench server's tool calls from the kernel; with ``direct``, each one-call cell is paired
    with one direct call, and each 200-call cell with 200 direct calls, taking turns in ABBA order."""
    with r.guard("tool_call", "tool_call_first", "tool_call_in_kernel", "tool_call_execute", "direct_call"):
        # The first call starts the MCP server on the host; reported apart from the steady state.
        one = "_bench_one({a})"
        t0 = time.perf_counter()
        await r.run(ex, one.format(a=-1))
        r.metrics["tool_call_first"] = scalar((time.perf_counter() - t0) * 1000, unit="ms")
        for i in range(r.cfg.warmup):
            await r.run(ex, one.format(a=i))
            if direct is not None:
                await direct(i)
        await r.run(ex, "_bench_calls.clear(); _bench_ok.clear()")
        e2e: list[float] = []
        floor: list[float] = []
        direct_ok = 0
        for i in range(r.cfg.tool_calls):
            # ABBA: the direct call goes first in every other pair, so that neither side always
            # follows the other (and finds the machine the way the other left it).
            direct_first = direct is not None and i % 4 in (1, 2)
            if direct is not None and direct_first:
                t0 = time.perf_counter()
                direct_ok += await direct(i)
                floor.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await r.run(ex, one.format(a=i))
            e2e.append(time.perf_counter() - t0)
            if direct is not None and not direct_first:
                t0 = time.perf_counter()
                direct_ok += await direct(i)
                floor.append(time.perf_counter() - t0)
        inner: list[float] = await r.readback(ex, "_bench_calls")
        ok: list[bool] = await r.readback(ex, "_bench_ok")
        r.metrics["tool_call_in_kernel"] = summarize(inner, wrong_results=ok.count(False))
        r.metrics["tool_call_execute"] = summarize(e2e)
        if direct is not None:
            r.metrics["direct_call"] = summarize(floor, wrong_results=len(floor) - direct_ok)
        m = r.metrics
        _log(
            f"tool call in kernel: median {m['tool_call_in_kernel']['median']:.2f} ms (execute e2e "
            f"{m['tool_call_execute']['median']:.2f} ms), first {m['tool_call_first']['median']:.0f} ms"
        )

    with r.guard("seq_calls", "seq_calls", "direct_seq_calls"):
        n = r.cfg.seq_calls
        cell = (
            f"_t0 = _bench_time.perf_counter(); _ok = 0\n"
            f"for _i in range({n}):\n    _ok += {_CALL.format(a='_i')}.result == _i + 1\n"
            f"_bench_seq.append((_bench_time.perf_counter() - _t0, _ok))"
        )
        direct_reps: list[tuple[float, int]] = []
        for rep in range(r.cfg.seq_reps):
            direct_first = direct is not None and rep % 4 in (1, 2)  # ABBA, as above
            if direct is not None and direct_first:
                direct_reps.append(await _direct_loop(direct, n))
            await r.run(ex, cell)
            if direct is not None and not direct_first:
                direct_reps.append(await _direct_loop(direct, n))
        reps: list[list[float]] = await r.readback(ex, "_bench_seq")
        rates = [n / elapsed for elapsed, _ in reps]
        r.metrics["seq_calls"] = summarize(
            rates,
            unit="calls/s",
            scale=1.0,
            calls=n,
            ok_calls=[int(ok) for _, ok in reps],
            higher_is_better=True,
        )
        _log(f"{n} calls in one cell: median {r.metrics['seq_calls']['median']:.0f} calls/s")
        if direct_reps:
            r.metrics["direct_seq_calls"] = summarize(
                [n / elapsed for elapsed, _ in direct_reps],
                unit="calls/s",
                scale=1.0,
                calls=n,
                ok_calls=[ok for _, ok in direct_reps],
                higher_is_better=True,
            )
            _log(f"{n} calls straight from the host: median {r.metrics['direct_seq_calls']['median']:.0f} calls/s")


async def _everything_calls(r: _Run, ex: object) -> None:
    """The same call metrics against server-everything (Node), whose own per-call cost is far below
    a Python MCP server's: this shows the cost of the path between kernel and server.

    A call is timed two ways. One call per cell finds every process on the path idle since the last
    cell (the server, the host loop, the kernel's socket); waking each costs more than the work
    itself on this VM. Back to back, inside the 200-call cell, the path is warm.
    """
    names = ("tool_call_in_kernel_everything", "tool_call_loop_everything", "seq_calls_everything")
    with r.guard("everything_calls", *names):
        call = "_bench_sum.run(_bench_sum.Params(a={a}, b=1))"
        await r.run(
            ex,
            f"from mcptools.{EVERYTHING_SERVER} import get_sum as _bench_sum\n"
            "_bench_ev_calls = []\n_bench_ev_seq = []\n_bench_ev_loop = []\n"
            # Timed inside one statement, as _bench_one above.
            "def _bench_ev_one(a):\n"
            "    t0 = _bench_time.perf_counter()\n"
            f"    {call.format(a='a')}\n"
            "    _bench_ev_calls.append(_bench_time.perf_counter() - t0)\n",
        )
        one = "_bench_ev_one({a})"
        for i in range(r.cfg.warmup):
            await r.run(ex, one.format(a=i))
        await r.run(ex, "_bench_ev_calls.clear()")
        for i in range(r.cfg.tool_calls):
            await r.run(ex, one.format(a=i))
        inner: list[float] = await r.readback(ex, "_bench_ev_calls")
        r.metrics["tool_call_in_kernel_everything"] = summarize(inner)
        n = r.cfg.seq_calls
        cell = (
            f"_t0 = _bench_time.perf_counter()\nfor _i in range({n}):\n"
            f"    _t1 = _bench_time.perf_counter(); {call.format(a='_i')}\n"
            "    _bench_ev_loop.append(_bench_time.perf_counter() - _t1)\n"
            "_bench_ev_seq.append(_bench_time.perf_counter() - _t0)"
        )
        for _ in range(r.cfg.seq_reps):
            await r.run(ex, cell)
        reps: list[float] = await r.readback(ex, "_bench_ev_seq")
        loop: list[float] = await r.readback(ex, "_bench_ev_loop")
        r.metrics["tool_call_loop_everything"] = summarize(loop)
        r.metrics["seq_calls_everything"] = summarize(
            [n / elapsed for elapsed in reps], unit="calls/s", scale=1.0, calls=n, higher_is_better=True
        )
        m = r.metrics
        _log(
            f"server-everything: one call per cell {m['tool_call_in_kernel_everything']['median']:.2f} ms, "
            f"back to back {m['tool_call_loop_everything']['median']:.2f} ms, "
            f"{m['seq_calls_everything']['median']:.0f} calls/s"
        )


_MCP_METRICS = (
    "generate_benchsrv",
    "generate_everything",
    "tool_call_first",
    "tool_call_in_kernel",
    "tool_call_execute",
    "seq_calls",
    "direct_call",
    "direct_seq_calls",
    "kernel_rss_after_tool_import",
    "kernel_rss_after_tool_calls",
    "tool_call_in_kernel_everything",
    "tool_call_loop_everything",
    "seq_calls_everything",
)


async def run_side(side: Side, cfg: Config, work: Path) -> dict[str, Any]:
    """Run the whole workload against one side and return its JSON-able report."""
    r = _Run(side=side, cfg=cfg, work=work)
    started = time.perf_counter()
    _log(f"{side.name} {side.version}: start/stop x{cfg.starts} per sandbox variant {side.sandbox_variants}")
    await _starts(r)

    tools_ready = False
    if side.mcp_unavailable is None:
        tools_ready = await _generation(r)
    else:
        for name in _MCP_METRICS:
            r.metrics[name] = {"na": side.mcp_unavailable}

    with r.guard("main_executor", "kernel_rss_idle"):
        cm = side.executor(work, sandbox=side.sandbox_variants[0], tools=tools_ready)
        async with _entered(cm) as (ex, _):
            r.metrics["kernel_rss_idle"] = kernel_rss("idle after start")
            await _executes(r, ex)
            if tools_ready:
                await _tool_calls(r, ex)
    if side.mcp_unavailable is None and not tools_ready:
        for name in _MCP_METRICS:
            r.metrics.setdefault(name, {"na": "bench server generation failed"})

    return {
        "side": side.name,
        "version": side.version,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "config": asdict(cfg),
        "metrics": r.metrics,
        "errors": r.errors,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main(make_side: Callable[[], Awaitable[Side]]) -> None:
    """Entry point of a side script: config as JSON in argv[1], report as JSON on stdout."""
    args = json.loads(sys.argv[1])
    work = Path(args.pop("work"))
    quick = bool(args.pop("quick"))
    cfg = Config.quick(**args) if quick else Config(**args)
    os.chdir(work)

    async def _main() -> dict[str, Any]:
        return await run_side(await make_side(), cfg, work)

    report = anyio.run(_main)
    # The runner reads the last line of stdout; anything the executors print goes before it.
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    sys.stdout.flush()

"""Side-by-side benchmark: this repository's ipybox against ipybox 0.9.2 from PyPI.

    uv run --frozen python bench/run.py [--quick] [--side ours|peer|both]

Creates the peer venv (bench/.peer/venv) on first use, runs the same workload (bench/benchlib.py)
against each side in its own subprocess and interpreter, one side after the other, prints a table of
medians with n/min/p95, the ratio peer/ours and our targets, and writes everything as JSON to
bench/results/<timestamp>.json. See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import baseline
import tracing_cost

__all__ = ("main",)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER_VENV = BENCH / ".peer" / "venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_REQUIREMENTS = ("ipybox==0.9.2", "mcp<2", "psutil")
RESULTS = BENCH / "results"
EVERYTHING_BIN = REPO / "node_modules" / ".bin" / "mcp-server-everything"

# A side that runs longer than this is hung, not slow (a full peer run takes about 3 minutes).
SIDE_TIMEOUT = 30 * 60.0
# One-minute load average above which a side's numbers are flagged as taken on a busy machine.
BUSY_LOAD = 0.5
# Creating the peer venv downloads ~60 packages; generous for a slow mirror.
INSTALL_TIMEOUT = 10 * 60.0


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    target: str | None = None
    higher_is_better: bool = False

    def meets(self, metric: dict[str, Any]) -> bool | None:
        """Whether our median meets the target; None when there is no target or no number."""
        if self.target is None or "median" not in metric:
            return None
        op, value = self.target.split(" ", 1)
        median = float(metric["median"])
        limit = float(value.split()[0])
        return median <= limit if op == "≤" else median >= limit if op == "≥" else median == limit


ROWS = (
    Row("start_ready", "start → ready (default sandbox)", "≤ 600 ms"),
    Row("stop", "stop (default sandbox)"),
    Row("start_ready_none", "start → ready (sandbox=None)"),
    Row("sandbox_overhead", "sandbox start overhead", "≤ 20 ms"),
    Row("sandbox_overhead_cpu", "sandbox start overhead, CPU time"),
    Row("execute_1plus1", 'execute("1+1")', "≤ 4 ms"),
    Row("lost_outputs", "lost print(i) outputs", "= 0 lost"),
    Row("kernel_rss_idle", "kernel RSS, idle after start"),
    Row("generate_benchsrv", "generate_mcp_sources(benchsrv)"),
    Row("generate_everything", "generate_mcp_sources(everything)", "≤ 1000 ms"),
    Row("tool_call_first", "first tool call (starts server)"),
    Row("tool_call_in_kernel", "tool call (Python server), timed in kernel"),
    Row("tool_call_execute", "one-call cell, execute() e2e"),
    Row("seq_calls", "200 calls in one cell (Python server)", higher_is_better=True),
    Row("direct_call", "floor: add() from the host, MCP SDK"),
    Row("direct_seq_calls", "floor: 200 add() from the host", higher_is_better=True),
    Row("tool_call_in_kernel_everything", "tool call (server-everything), one per cell"),
    Row("tool_call_loop_everything", "tool call (server-everything), back to back", "≤ 1.5 ms"),
    Row("seq_calls_everything", "200 calls in one cell (server-everything)", "≥ 700 calls/s", higher_is_better=True),
    Row("kernel_rss_after_tool_import", "kernel RSS after tool import", "≤ 65 MB"),
    Row("kernel_rss_after_tool_calls", "kernel RSS after tool calls"),
)


# The tool-call path against its floor (the same server called from the host through the MCP SDK,
# taking turns with the kernel's calls in our side's run): a call from the kernel may cost this much
# more than the direct one, and a loop of calls must reach this share of the direct rate.
CALL_OVER_FLOOR_MS = 1.0
LOOP_SHARE_OF_FLOOR = 0.90


def floor_ratios(ours: dict[str, Any]) -> dict[str, Any]:
    """Our tool calls against the direct calls measured with them: the one-call difference in ms
    and the loop's share of the direct rate, each with its target; {} without the floor.

    Each figure is the median over the pairs (a kernel sample and the direct one taken next to it)
    of their difference or ratio, not the difference or ratio of the two medians: a change in the
    machine's load moves both of a pair, so the pairs' figures scatter far less than either side's.
    """
    metrics = ours.get("metrics", {})
    out: dict[str, Any] = {}
    call, floor = metrics.get("tool_call_in_kernel", {}), metrics.get("direct_call", {})
    if "median" in call and "median" in floor:
        over = _paired_median(call, floor, lambda ours_ms, floor_ms: ours_ms - floor_ms)
        out["call_over_floor_ms"] = {
            "value": round(over, 3),
            "ours_ms": call["median"],
            "floor_ms": floor["median"],
            "target": f"≤ +{CALL_OVER_FLOOR_MS:g} ms",
            "target_met": over <= CALL_OVER_FLOOR_MS,
        }
    loop, direct = metrics.get("seq_calls", {}), metrics.get("direct_seq_calls", {})
    if "median" in loop and "median" in direct and float(direct["median"]) > 0:
        share = _paired_median(loop, direct, lambda ours_rate, floor_rate: ours_rate / floor_rate)
        out["loop_share_of_floor"] = {
            "value": round(share, 3),
            "ours_calls_s": loop["median"],
            "floor_calls_s": direct["median"],
            "pairs": loop["n"],
            "target": f"≥ {LOOP_SHARE_OF_FLOOR:.0%}",
            "target_met": share >= LOOP_SHARE_OF_FLOOR,
        }
    return out


def _paired_median(ours: dict[str, Any], floor: dict[str, Any], compare: Callable[[float, float], float]) -> float:
    """The median of ``compare`` over the samples taken in pairs; of the two medians if they were not."""
    a, b = ours.get("samples", []), floor.get("samples", [])
    if a and len(a) == len(b) and all(float(x) > 0 for x in b):
        return statistics.median(compare(float(x), float(y)) for x, y in zip(a, b, strict=True))
    return compare(float(ours["median"]), float(floor["median"]))


def print_floor_ratios(ratios: dict[str, Any]) -> None:
    if not ratios:
        return
    print("tool calls against the same calls made straight from the host (ours; taking turns, same run):")
    met = {True: "ok", False: "MISSED"}
    call = ratios.get("call_over_floor_ms")
    if call:
        print(
            f"  one call per cell: {_num(call['ours_ms'])} ms against {_num(call['floor_ms'])} ms direct, "
            f"{call['value']:+.2f} ms (median of the pairs' differences; target {call['target']}: "
            f"{met[call['target_met']]})"
        )
    loop = ratios.get("loop_share_of_floor")
    if loop:
        print(
            f"  200 calls in one cell: {_num(loop['ours_calls_s'])} calls/s against {_num(loop['floor_calls_s'])} "
            f"direct, {loop['value']:.0%} of its rate (median of {loop['pairs']} pairs; "
            f"target {loop['target']}: {met[loop['target_met']]})"
        )


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _peer_env() -> dict[str, str]:
    """Our environment minus our venv, so nothing of ours leaks into the peer's processes."""
    env = dict(os.environ)
    ours = env.pop("VIRTUAL_ENV", None)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and (ours is None or not p.startswith(ours))]
    env["PATH"] = os.pathsep.join([str(PEER_VENV / "bin"), *path])
    env.pop("PYTHONPATH", None)
    return env


def _peer_ready() -> bool:
    if not PEER_PYTHON.exists():
        return False
    probe = subprocess.run(
        [str(PEER_PYTHON), "-c", "from importlib.metadata import version; print(version('ipybox'))"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=_peer_env(),
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "0.9.2":
        return False
    # The peer starts its kernel gateway through this script; a venv moved from elsewhere keeps a
    # shebang to its old path and fails only there.
    try:
        gateway = subprocess.run(
            [str(PEER_VENV / "bin" / "jupyter"), "--version"], capture_output=True, env=_peer_env(), check=False
        )
    except OSError:
        return False
    return gateway.returncode == 0


def ensure_peer_venv() -> None:
    """Create bench/.peer/venv with ipybox 0.9.2 unless it is already there."""
    if _peer_ready():
        return
    _log(f"creating peer venv {PEER_VENV} with {' '.join(PEER_REQUIREMENTS)}")
    shutil.rmtree(PEER_VENV, ignore_errors=True)
    uv = shutil.which("uv")
    # The peer gets the same base interpreter as ours, so Python itself is not a variable.
    base = getattr(sys, "_base_executable", sys.executable)
    if uv is not None:
        steps = [
            [uv, "venv", "--quiet", "--python", base, str(PEER_VENV)],
            [uv, "pip", "install", "--quiet", "--python", str(PEER_PYTHON), *PEER_REQUIREMENTS],
        ]
    else:
        steps = [
            [base, "-m", "venv", str(PEER_VENV)],
            [str(PEER_PYTHON), "-m", "pip", "install", "--quiet", *PEER_REQUIREMENTS],
        ]
    for step in steps:
        subprocess.run(step, check=True, timeout=INSTALL_TIMEOUT, env=_peer_env())
    if not _peer_ready():
        raise SystemExit(f"peer venv {PEER_VENV} was created but does not import ipybox 0.9.2")


def run_side(side: str, quick: bool) -> dict[str, Any]:
    """Run one side's script in its own interpreter and return the report it prints."""
    python, env = (str(PEER_PYTHON), _peer_env()) if side == "peer" else (sys.executable, dict(os.environ))
    work = Path(tempfile.mkdtemp(prefix=f"ipybox-bench-{side}-"))
    config = {
        "work": str(work),
        "quick": quick,
        # Both sides talk to the same server implementation, run by our interpreter (mcp 2.x).
        "server_python": sys.executable,
        "everything_bin": str(EVERYTHING_BIN) if EVERYTHING_BIN.exists() else None,
    }
    load_before = _loadavg()
    _log(f"--- {side}: {python} (work dir {work}, load average {load_before:.2f})")
    if load_before > BUSY_LOAD:
        _log(f"warning: the machine is busy (load {load_before:.2f}); numbers will be noisy")
    try:
        proc = subprocess.run(
            [python, str(BENCH / f"side_{side}.py"), json.dumps(config)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=work,
            env=env,
            timeout=SIDE_TIMEOUT,
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        _log(f"{side} printed no report (exit code {proc.returncode}); its stdout ends with: {lines[-5:]!r}")
        return {
            "side": side,
            "failed": f"exit code {proc.returncode}, no report",
            "metrics": {},
            "errors": {},
        }
    if proc.returncode != 0:
        report.setdefault("errors", {})["exit"] = f"exit code {proc.returncode}"
    report["load_average"] = {"before": load_before, "after": _loadavg()}
    return report


def _loadavg() -> float:
    """One-minute load average; other work on this 2-core machine skews every number."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure_baselines(quick: bool) -> dict[str, dict[str, Any]]:
    """Floors measured with plain clients in this process, for reading the kernel and MCP rows."""
    _log("--- baselines: plain jupyter_client and MCP clients in the host process")
    jobs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "kernel_floor": partial(baseline.kernel_floor, starts=3 if quick else 5),
        "direct_call_benchsrv": baseline.direct_call,
    }
    if EVERYTHING_BIN.exists():
        jobs["connect_list_everything"] = partial(
            baseline.connect_and_list, str(EVERYTHING_BIN), ["stdio"], reps=1 if quick else 3
        )
    results: dict[str, dict[str, Any]] = {}
    for name, job in jobs.items():
        try:
            results[name] = anyio.run(job)
        except Exception as exc:  # top level of an optional measurement: report it, keep the results
            _log(f"baseline {name} failed: {exc!r}")
            results[name] = {"na": f"error: {exc!r}"[:200]}
    return results


def _num(x: float) -> str:
    a = abs(x)
    return f"{x:.2f}" if a < 10 else f"{x:.1f}" if a < 100 else f"{x:.0f}"


def _cell(metric: dict[str, Any] | None) -> str:
    if not metric:
        return "—"
    if "median" not in metric:
        reason = str(metric.get("na", "?"))
        return (reason if reason.startswith("n/a") else f"n/a ({reason})")[:48]
    if metric.get("unit") == "lost":
        return f"{metric['median']:.0f}/{metric['n']}"
    if metric["n"] == 1:
        return f"{_num(metric['median'])} {metric['unit']}"
    return (
        f"{_num(metric['median'])} {metric['unit']} "
        f"(n={metric['n']}, min {_num(metric['min'])}, p95 {_num(metric['p95'])})"
    )


def _ratio(ours: dict[str, Any] | None, peer: dict[str, Any] | None) -> float | None:
    if not ours or not peer or "median" not in ours or "median" not in peer:
        return None
    if ours.get("unit") == "lost" or float(ours["median"]) <= 0:
        return None
    return float(peer["median"]) / float(ours["median"])


def comparison(ours: dict[str, Any], peer: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric: both medians, peer/ours, our target and whether it is met."""
    rows: list[dict[str, Any]] = []
    for row in ROWS:
        o = ours.get("metrics", {}).get(row.key)
        p = peer.get("metrics", {}).get(row.key)
        if o is None and p is None:
            continue
        ratio = _ratio(o, p)
        rows.append(
            {
                "metric": row.key,
                "label": row.label,
                "ours": _cell(o),
                "peer": _cell(p),
                "peer_over_ours": None if ratio is None else round(ratio, 3),
                "higher_is_better": row.higher_is_better,
                "target": row.target,
                "target_met": row.meets(o) if o else None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], ours: dict[str, Any], peer: dict[str, Any]) -> None:
    headers = ("metric", "ours", "peer (ipybox 0.9.2)", "peer/ours", "target (ours)")
    table: list[tuple[str, ...]] = []
    for r in rows:
        ratio = "—" if r["peer_over_ours"] is None else f"{r['peer_over_ours']:.2f}x"
        if r["higher_is_better"] and ratio != "—":
            ratio += " (↑ better)"
        met = {True: "ok", False: "MISSED", None: ""}[r["target_met"]]
        target = f"{r['target']} {met}".strip() if r["target"] else ""
        table.append((r["label"], r["ours"], r["peer"], ratio, target))
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print()
    print(f"ours: {ours.get('version', '?')}   peer: {peer.get('version', '?')}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line)
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)))
    print(line)
    print("times are medians of time.perf_counter() samples; peer/ours > 1 means ours is faster/smaller,")
    print("except for calls/s (↑ better), where < 1 means ours is faster.")
    for side in (ours, peer):
        for group, err in side.get("errors", {}).items():
            print(f"{side.get('side')}: {group} failed: {err}")
        if "failed" in side:
            print(f"{side['side']}: {side['failed']}")
        load = side.get("load_average")
        if load and max(load.values()) > BUSY_LOAD:
            print(f"{side.get('side')}: machine was busy (load average {load}); treat its numbers as noisy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (about 2 minutes in all)")
    ap.add_argument("--side", choices=("both", "ours", "peer"), default="both")
    args = ap.parse_args()

    started = time.time()
    sides = ("peer", "ours") if args.side == "both" else (args.side,)
    if "peer" in sides:
        ensure_peer_venv()
    # One side after the other: the machine has two cores and each side uses both.
    reports = {side: run_side(side, args.quick) for side in sides}
    ours = reports.get("ours", {"side": "ours", "metrics": {}})
    peer = reports.get("peer", {"side": "peer", "metrics": {}})
    floors = measure_baselines(args.quick)
    rows = comparison(ours, peer)
    print_table(rows, ours, peer)
    ratios = floor_ratios(ours)
    print_floor_ratios(ratios)
    print("floors, measured with plain clients in this process:")
    kernel = floors["kernel_floor"]
    if "na" in kernel:
        print(f"  plain ipykernel via jupyter_client: {_cell(kernel)}")
    else:
        print(f"  plain ipykernel via jupyter_client, start -> ready: {_cell(kernel['start_ready'])}")
        print(f"  plain ipykernel via jupyter_client, execute_interactive('1+1'): {_cell(kernel['execute_1plus1'])}")
        for key, label in (("start_ready", "start -> ready"), ("execute_1plus1", "execute('1+1')")):
            mine, floor = ours["metrics"].get(key, {}), kernel[key]
            if "median" in mine and "median" in floor:
                above = float(mine["median"]) - float(floor["median"])
                print(f"  ours above that floor, {label}: {above:+.2f} ms")
    print(f"  benchsrv add() called straight from the host (no kernel): {_cell(floors['direct_call_benchsrv'])}")
    if "connect_list_everything" in floors:
        print(f"  everything: spawn + initialize + list_tools: {_cell(floors['connect_list_everything'])}")

    tracing = {}
    if "ours" in sides:
        _log("tracing: per tool call, untraced / spans off / spans on, taking turns")
        tracing = anyio.run(tracing_cost.measure, args.quick)
        tracing["load_1min"] = _loadavg()
        tracing_cost.print_costs(tracing)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "timestamp": stamp,
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "quick": args.quick,
                "wall_s": round(time.time() - started, 1),
                "comparison": rows,
                "tool_calls_against_floor": ratios,
                "baselines": floors,
                "tracing": tracing,
                "sides": reports,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out.relative_to(REPO)} (total {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()

"""Schema fidelity on real MCP servers: generated ``Params`` against the tools' own schemas and validation.

    uv run --frozen python bench/schema_fidelity_servers.py              # about a minute
    uv run --frozen python bench/schema_fidelity_servers.py --list       # every disagreement

The servers are the real ones ``bash scripts/setup.sh --test-servers`` installs from npm
(server-everything, server-filesystem, server-memory), started over stdio with every file they
touch in a temporary directory; nothing goes beyond this machine.

For each tool (its schema from ``tools/list``) the instances are drawn from the schema itself: the
required properties only, every property, each required property left out, each property set to
``"5"``, ``5``, ``1.5``, ``1.0``, ``true``, ``[]`` and ``{}``, ``null`` for each required property,
and a misspelled property name. Then:

- **ipybox** is the real generation path (`generate_package` against the running server), each
  instance through the module's ``_arguments`` (what ``run()`` sends); scored as
  `schema_fidelity.score` scores the suite, against ``jsonschema`` (the tool's dialect, formats as
  annotations).
- **the server**: the same instance sent as it is with ``tools/call``; a call the server refuses as
  invalid arguments (its own validator: zod in these servers, ``-32602`` / ``Invalid arguments``)
  counts as a reject, anything else as an accept. Tools that wait on the client or on time
  (sampling, long operations) are not called. Reported: how often ipybox and the server agree,
  and how often the server and ``jsonschema`` agree (the oracle is only as good as that).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema_fidelity import REPO, Score, canonical

BIN = REPO / "node_modules" / ".bin"
# Tools that wait on the client (sampling, elicitation) or on the clock, or reach out: not called.
NOT_CALLED = frozenset({"trigger-long-running-operation", "simulate-research-query", "gzip-file-as-resource"})
REFUSED = re.compile(r"-32602|Invalid arguments|Input validation error|invalid_type|ZodError", re.IGNORECASE)
CALL_TIMEOUT = 20.0


def servers(tmp: Path) -> dict[str, dict[str, Any]]:
    files = tmp / "files"
    files.mkdir()
    (files / "a").write_text("one\ntwo\n")
    return {
        "everything": {"command": str(BIN / "mcp-server-everything")},
        "filesystem": {"command": str(BIN / "mcp-server-filesystem"), "args": [str(files)], "cwd": str(files)},
        "memory": {"command": str(BIN / "mcp-server-memory"), "env": {"MEMORY_FILE_PATH": str(tmp / "memory.jsonl")}},
    }


# ------------------------------------------------------------------------------------------ instances


def _resolve(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    for _ in range(8):
        schema = cast("dict[str, Any]", node) if isinstance(node, dict) else {}
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return schema
        target: Any = root
        for part in ref[2:].split("/") if ref != "#" else []:
            where = cast("dict[str, Any]", target) if isinstance(target, dict) else {}
            target = where.get(part.replace("~1", "/").replace("~0", "~"), {})
        node = target
    return {}


def sample(node: Any, root: dict[str, Any], *, full: bool, depth: int = 0) -> Any:
    """A value the schema most likely accepts (the oracle decides); every property when ``full``."""
    schema = _resolve(node, root)
    for key in ("const",):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in cast("list[Any]", schema.get(key) or []) if _resolve(o, root).get("type") != "null"]
        if options:
            return sample(options[0], root, full=full, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in cast("list[Any]", kind) if k != "null"), None)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if depth > 6:
        return None
    if kind == "string":
        return "a" * max(1, int(schema.get("minLength", 1)))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + 1 if isinstance(low, int | float) else 1
    if kind == "boolean":
        return True
    if kind == "array":
        return [sample(schema.get("items", {}), root, full=full, depth=depth + 1)] * max(
            1, int(schema.get("minItems", 1))
        )
    if kind == "object":
        properties = cast("dict[str, Any]", schema.get("properties") or {})
        required = set(schema.get("required") or [])
        return {k: sample(v, root, full=full, depth=depth + 1) for k, v in properties.items() if full or k in required}
    return None


def instances(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    minimal, full = sample(schema, schema, full=False), sample(schema, schema, full=True)
    yield "required only", minimal
    yield "every property", full
    required = list(schema.get("required") or [])
    properties = list(cast("dict[str, Any]", schema.get("properties") or {}))
    for name in required:
        yield f"{name} left out", {k: v for k, v in full.items() if k != name}
        yield f"{name} null", {**full, name: None}
    for name in properties:
        wrong: tuple[Any, ...] = ("5", 5, 1.5, 1.0, True, [], {})
        for bad in wrong:
            yield f"{name}={json.dumps(bad)}", {**full, name: copy.deepcopy(bad)}
    if properties:
        yield "misspelled key", {**full, properties[0][::-1] + "x": full.get(properties[0], "a")}


def oracle(schema: dict[str, Any]) -> Any:
    import jsonschema

    dialect = schema.get("$schema", "")
    cls = jsonschema.Draft7Validator if "draft-07" in str(dialect) else jsonschema.Draft202012Validator
    return cls(schema)


# ----------------------------------------------------------------------------------------------- run


async def run(tmp: Path, names: list[str]) -> dict[str, Any]:
    import mcp.types as mcp_types

    from ipybox._mcp._servers import open_session, parse_server_params
    from ipybox.codegen._codegen import generate_package

    root = tmp / "mcptools"
    out: dict[str, Any] = {}
    devnull = open(os.devnull, "w")  # noqa: ASYNC230, SIM115 (the servers' stderr; closed at exit)
    for name, params in servers(tmp).items():
        if names and name not in names:
            continue
        report = await generate_package(name, params, root)
        modules = {t.name: t.module for t in report.sources.tools}
        fallbacks = sum(1 for t in report.sources.tools if "Params" in t.fallbacks)
        out[f"{name}/"] = {"fallbacks": fallbacks}
        if str(tmp) not in sys.path:
            sys.path.insert(0, str(tmp))
        async with open_session(name, parse_server_params(params), errlog=devnull) as session:
            tools = (await session.list_tools()).tools
            for tool in tools:
                module = importlib.import_module(f"mcptools.{report.sources.package}.{modules[tool.name]}")
                schema = dict(tool.input_schema)
                validator = oracle(schema)
                rows: list[dict[str, Any]] = []
                for label, data in instances(schema):
                    valid = bool(validator.is_valid(data))
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            sent = module._arguments(data)
                        accepted: bool = True
                    except Exception:
                        accepted, sent = False, None
                    server: bool | None = None
                    if tool.name not in NOT_CALLED:
                        server = await _server_accepts(session, tool.name, data, mcp_types)
                    rows.append(
                        {
                            "label": label,
                            "data": data,
                            "valid": valid,
                            "accepted": accepted,
                            "sent": sent,
                            "server": server,
                        }
                    )
                out[f"{name}.{tool.name}"] = rows
    return out


async def _server_accepts(session: Any, tool: str, data: Any, mcp_types: Any) -> bool | None:
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            result = await session.call_tool(tool, data)
    except TimeoutError:
        return None
    except Exception as exc:
        return not REFUSED.search(str(exc))
    if not result.is_error:
        return True
    text = " ".join(getattr(item, "text", "") for item in result.content)
    return not REFUSED.search(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", action="append", default=[], help="only this server (repeatable)")
    parser.add_argument("--list", action="store_true", help="print every disagreement")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    if not (BIN / "mcp-server-everything").exists():
        sys.exit("the test servers are not installed: bash scripts/setup.sh --test-servers")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ipybox-fidelity-servers-") as tmp:
        results = anyio.run(run, Path(tmp), args.server)
    ours, per_server = Score(), dict[str, Score]()
    server_vs_ipybox = server_vs_oracle = called = fallbacks = 0
    listing: list[str] = []
    for tool, rows in results.items():
        if tool.endswith("/"):
            fallbacks += rows["fallbacks"]
            continue
        score = per_server.setdefault(tool.split(".", 1)[0], Score())
        score.groups += 1
        score.generated += 1
        for row in rows:
            score.instances += 1
            score.valid += row["valid"]
            if row["accepted"] == row["valid"]:
                score.agree += 1
            elif row["valid"]:
                score.false_rejects += 1
                listing.append(f"{tool}: ipybox rejects valid {row['label']}: {canonical(row['data'])[:100]}")
            else:
                score.false_accepts += 1
                listing.append(f"{tool}: ipybox accepts invalid {row['label']}: {canonical(row['data'])[:100]}")
            if row["valid"] and row["accepted"] and canonical(row["sent"]) != canonical(row["data"]):
                score.altered += 1
                listing.append(
                    f"{tool}: altered {row['label']}: {canonical(row['data'])[:60]} -> {canonical(row['sent'])[:60]}"
                )
            if row["server"] is not None:
                called += 1
                server_vs_ipybox += row["server"] == row["accepted"]
                server_vs_oracle += row["server"] == row["valid"]
                if row["server"] != row["accepted"]:
                    verdict = "accepts" if row["server"] else "refuses"
                    listing.append(f"{tool}: server {verdict}, ipybox does not: {row['label']}")
    print("| server | tools | instances | agreement with jsonschema | false rejects | false accepts ", end="")
    print("| altered (of valid) |")
    print("|---|---|---|---|---|---|---|")
    for name, score in sorted(per_server.items()):
        ours.add(score)
        r = score.row()
        print(
            f"| {name} | {r['groups']} | {r['instances']} | {r['agreement_pct']}% | {r['false_rejects']} | "
            f"{r['false_accepts']} | {r['altered']} / {r['valid']} |"
        )
    r = ours.row()
    print(
        f"| all | {r['groups']} | {r['instances']} | {r['agreement_pct']}% | {r['false_rejects']} | "
        f"{r['false_accepts']} | {r['altered']} / {r['valid']} |"
    )
    print(f"\ntools with a permissive (untyped) Params: {fallbacks}")
    if called:
        print(
            f"\nsent to the servers: {called} instances; the server's own validation agrees with ipybox on "
            f"{100.0 * server_vs_ipybox / called:.1f}% and with jsonschema on {100.0 * server_vs_oracle / called:.1f}%"
        )
    print(f"{time.perf_counter() - started:.0f} s")
    if args.list:
        print("\n" + "\n".join(listing))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()

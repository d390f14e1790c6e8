"""Schema fidelity: generated ``Params`` against the JSON-Schema-Test-Suite, side by side with the peer.

    uv run --frozen python bench/schema_fidelity.py            # both drafts; about 2 minutes on 2 cores
    uv run --frozen python bench/schema_fidelity.py --json out.json --list-rejects --list-accepts
    uv run --frozen python bench/schema_fidelity.py --modes direct   # one set only (wrapped, direct, formats)

The suite is not in this repository: it is read at run time from the ``jsonschema`` sdist on PyPI
(``json/tests/`` in the archive), downloaded once with ``pip download --no-deps --no-binary :all:``
into ``bench/.cache/`` (git-ignored; ``--cache`` elsewhere, or ``--sdist`` for a file you have).

Each suite group (one schema, several instances labelled valid or not) becomes one MCP tool:

- *wrapped* (every group): ``{"type": "object", "properties": {"x": S}, "required": ["x"]}`` with
  instances ``{"x": i}``; refs into S (``#...``) are rewritten to ``#/properties/x...``.
- *direct* (object schemas without refs): S itself is the ``inputSchema``, with its object instances;
  this is where maps at the root, ``patternProperties`` and ``propertyNames`` of a whole tool show.
- *formats* (``optional/format``): the wrapped schema with ``"type": "string"`` added, since real
  format schemas are typed and the suite's are not.

A draft-7 group's tool says ``"$schema": "http://json-schema.org/draft-07/schema#"`` (as zod's
draft-7 output does): MCP reads a schema without ``$schema`` as 2020-12, where ``$ref`` siblings apply.
Real MCP servers, called over stdio: ``schema_fidelity_servers.py``.

Groups that need something no generator may do (remote refs, ``$id``-relative refs, anchors, dynamic
refs, vocabularies) are skipped and counted. The oracle is ``jsonschema`` with the draft's validator
and formats as annotations (JSON Schema's default, and what ``format`` means to most servers).

Sides, in one run on the same groups and instances:

- **ipybox**: the real generation path, `build_package_sources` on ``mcp.types.Tool`` listings, the
  modules written and imported, and each instance sent through the module's ``_arguments`` (what
  ``run()`` sends).
- **datamodel-code-generator**, used directly as its documentation says (``GenerateConfig`` with
  ``output_model_type=PydanticV2BaseModel``, ``class_name="Params"``, everything else default),
  each instance through ``Params.model_validate`` then ``model_dump(mode="json", by_alias=True,
  exclude_unset=True)``.

Scores per side: *generated* (groups with a typed model: ipybox's permissive fallback and the
peer's generation or import errors do not count), *agreement* with the oracle, *false rejects*
(valid instances rejected; any exception counts), *false accepts* (invalid instances accepted) and
*altered* (valid instances accepted but sent differently: JSON text compared, so ``5`` vs ``5.0``
and dropped keys count). Instances of groups a side could not generate are not scored for it.
The *MCP keywords* rows keep only the keyword files real tool schemas use.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
JSONSCHEMA_VERSION = "4.26.0"
DRAFTS = ("draft2020-12", "draft7")
# Keyword files whose keywords real MCP tool schemas use (zod, pydantic and hand-written schemas).
MCP_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "allOf",
        "anyOf",
        "const",
        "default",
        "defs",
        "definitions",
        "enum",
        "exclusiveMaximum",
        "exclusiveMinimum",
        "format",
        "items",
        "maxItems",
        "maxLength",
        "maximum",
        "minItems",
        "minLength",
        "minimum",
        "multipleOf",
        "oneOf",
        "pattern",
        "properties",
        "ref",
        "required",
        "type",
        "uniqueItems",
    }
)
# Keyword files that need remote documents, or cannot mean anything to a code generator.
SKIPPED_FILES = frozenset({"refRemote", "dynamicRef", "vocabulary", "cross-draft", "anchor", "id", "unknownKeyword"})
# Keys in a schema that make a group depend on resolution no generator here does.
UNRESOLVABLE_KEYS = frozenset({"$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"})
OBJECT_KEYWORDS = frozenset(
    {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "$schema",
        "description",
    }
)


# ---------------------------------------------------------------------------------------------- suite


def suite_archive(cache: Path, sdist: Path | None) -> Path:
    if sdist is not None:
        return sdist
    found = sorted(cache.glob(f"jsonschema-{JSONSCHEMA_VERSION}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    pip = shutil.which("pip") or shutil.which("pip3")
    if pip is None:
        sys.exit("pip is not on PATH; download the jsonschema sdist yourself and pass --sdist")
    print(f"downloading the jsonschema {JSONSCHEMA_VERSION} sdist into {cache} ...", file=sys.stderr)
    subprocess.run(
        [pip, "download", "--no-deps", "--no-binary", ":all:", f"jsonschema=={JSONSCHEMA_VERSION}", "-d", str(cache)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return next(cache.glob(f"jsonschema-{JSONSCHEMA_VERSION}.tar.gz"))


@dataclass
class Group:
    draft: str
    file: str
    index: int
    description: str
    schema: Any
    tests: list[tuple[Any, bool]]
    mode: str = "wrapped"

    @property
    def label(self) -> str:
        return f"{self.draft}/{self.file}#{self.index} ({self.mode})"


def read_suite(archive: Path) -> Iterator[tuple[str, str, bool, list[dict[str, Any]]]]:
    """(draft, file stem, optional?, groups) for the core and optional/format files of both drafts."""
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            parts = member.name.split("/")
            if "tests" not in parts or not member.name.endswith(".json"):
                continue
            rest = parts[parts.index("tests") + 1 :]
            if rest[0] not in DRAFTS:
                continue
            handle = tar.extractfile(member)
            assert handle is not None
            groups = json.load(io.TextIOWrapper(handle, encoding="utf-8"))
            if len(rest) == 2:
                yield rest[0], rest[1][:-5], False, groups
            elif rest[1:2] == ["optional"] and rest[2:3] == ["format"] and len(rest) == 4:
                yield rest[0], rest[3][:-5], True, groups


def as_object(node: Any) -> dict[str, Any] | None:
    return cast("dict[str, Any]", node) if isinstance(node, dict) else None


def as_array(node: Any) -> list[Any] | None:
    return cast("list[Any]", node) if isinstance(node, list) else None


def children(node: Any) -> Iterator[tuple[str | None, Any]]:
    """(key, value) of an object's members, (None, item) of an array's items."""
    obj, items = as_object(node), as_array(node)
    if obj is not None:
        yield from obj.items()
    for item in items or []:
        yield None, item


def keys_in(node: Any) -> Iterator[str]:
    for key, value in children(node):
        if key is not None:
            yield key
        yield from keys_in(value)


def refs_in(node: Any) -> Iterator[str]:
    for key, value in children(node):
        if key == "$ref" and isinstance(value, str):
            yield value
        yield from refs_in(value)


def rewrite_refs(node: Any, prefix: str) -> Any:
    obj, items = as_object(node), as_array(node)
    if obj is not None:
        return {
            k: prefix + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else rewrite_refs(v, prefix)
            for k, v in obj.items()
        }
    if items is not None:
        return [rewrite_refs(v, prefix) for v in items]
    return node


def usable(schema: Any) -> bool:
    if set(keys_in(schema)) & UNRESOLVABLE_KEYS:
        return False
    return all(ref == "#" or ref.startswith("#/") for ref in refs_in(schema))


def is_object_schema(schema: Any) -> bool:
    obj = as_object(schema)
    if obj is None:
        return False
    if obj.get("type") == "object":
        return True
    return "type" not in obj and bool(set(obj) - {"$schema", "description"}) and set(obj) <= OBJECT_KEYWORDS


def groups(archive: Path) -> tuple[list[Group], dict[str, int]]:
    out: list[Group] = []
    skipped: dict[str, int] = {}
    for draft, stem, optional, raw in read_suite(archive):
        if stem in SKIPPED_FILES and not optional:
            skipped[f"{draft}/{stem}"] = len(raw)
            continue
        for index, group in enumerate(raw):
            schema = group["schema"]
            tests = [(t["data"], bool(t["valid"])) for t in group["tests"]]
            if not usable(schema):
                skipped[f"{draft}/{stem}#{index}"] = 1
                continue
            file = f"format/{stem}" if optional else stem
            obj = as_object(schema)
            if optional:
                typed = {**obj, "type": "string"} if obj is not None else schema
                tests = [(d, v) for d, v in tests if isinstance(d, str)]
                out.append(Group(draft, file, index, group["description"], typed, tests, "formats"))
                continue
            out.append(Group(draft, file, index, group["description"], schema, tests, "wrapped"))
            if obj is not None and is_object_schema(obj) and not any(True for _ in refs_in(obj)):
                direct = [(d, v) for d, v in tests if as_object(d) is not None]
                if direct:
                    out.append(
                        Group(draft, file, index, group["description"], {**obj, "type": "object"}, direct, "direct")
                    )
    return out, skipped


# A draft-7 group means draft 7, so its tool says so: MCP takes a schema without ``$schema`` as 2020-12.
DIALECTS = {"draft7": "http://json-schema.org/draft-07/schema#"}


def input_schema(group: Group) -> dict[str, Any]:
    dialect: dict[str, Any] = {"$schema": DIALECTS[group.draft]} if group.draft in DIALECTS else {}
    if group.mode == "direct":
        return {**dialect, **group.schema}
    schema = rewrite_refs(group.schema, "#/properties/x")
    obj = as_object(schema)
    if obj is not None and "$schema" in obj:
        # The dialect applies to the whole document, so it moves to the wrapper's root.
        dialect = {"$schema": obj["$schema"]}
        schema = {k: v for k, v in obj.items() if k != "$schema"}
    return {**dialect, "type": "object", "properties": {"x": schema}, "required": ["x"]}


def instances(group: Group) -> list[tuple[Any, bool]]:
    if group.mode == "direct":
        return group.tests
    return [({"x": data}, valid) for data, valid in group.tests]


# --------------------------------------------------------------------------------------------- oracle


def oracle(group: Group) -> list[bool] | None:
    import jsonschema

    cls = jsonschema.Draft202012Validator if group.draft == "draft2020-12" else jsonschema.Draft7Validator
    schema = input_schema(group)
    try:
        validator: Any = cls(schema)
        return [bool(validator.is_valid(data)) for data, _ in instances(group)]
    except Exception:
        return None


# -------------------------------------------------------------------------------------------- scoring


@dataclass
class Score:
    groups: int = 0
    generated: int = 0
    instances: int = 0
    agree: int = 0
    false_rejects: int = 0
    false_accepts: int = 0
    valid: int = 0
    altered: int = 0
    rejects: list[str] = field(default_factory=list[str])
    accepts: list[str] = field(default_factory=list[str])

    def add(self, other: Score) -> None:
        for name in ("groups", "generated", "instances", "agree", "false_rejects", "false_accepts", "valid", "altered"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rejects.extend(other.rejects)
        self.accepts.extend(other.accepts)

    def row(self) -> dict[str, Any]:
        def pct(n: int, d: int) -> float | None:
            return round(100.0 * n / d, 1) if d else None

        return {
            "groups": self.groups,
            "generated_pct": pct(self.generated, self.groups),
            "instances": self.instances,
            "agreement_pct": pct(self.agree, self.instances),
            "false_rejects": self.false_rejects,
            "false_accepts": self.false_accepts,
            "valid": self.valid,
            "altered": self.altered,
        }


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def score(group: Group, expected: list[bool], send: Any | None) -> Score:
    result = Score(groups=1)
    if send is None:
        return result
    result.generated = 1
    for (data, _), valid in zip(instances(group), expected, strict=True):
        result.instances += 1
        result.valid += valid
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sent = send(data)
            accepted = True
        except Exception:
            accepted, sent = False, None
        if accepted == valid:
            result.agree += 1
        elif valid:
            result.false_rejects += 1
            result.rejects.append(f"{group.label}: {canonical(data)[:120]}")
        else:
            result.false_accepts += 1
            result.accepts.append(f"{group.label}: {canonical(data)[:120]}")
        if valid and accepted and canonical(sent) != canonical(data):
            result.altered += 1
            result.rejects.append(f"{group.label}: altered {canonical(data)[:80]} -> {canonical(sent)[:80]}")
    return result


# ---------------------------------------------------------------------------------------------- sides


def import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ours(batch: list[Group], workdir: Path) -> list[Any | None]:
    """One generated package for a batch of groups, one tool per group; each tool's `_arguments`."""
    import mcp.types as mcp_types

    from ipybox.codegen._sources import build_package_sources

    tools = [mcp_types.Tool(name=f"g{i}", input_schema=input_schema(g)) for i, g in enumerate(batch)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sources = build_package_sources("suite", tools)
    alias = f"bench_{uuid.uuid4().hex}"
    root = workdir / alias
    (root / sources.package).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for name, text in sources.files.items():
        (root / sources.package / name).write_text(text)
    sys.path.insert(0, str(workdir))
    try:
        out: list[Any | None] = []
        by_name = {t.name: t for t in sources.tools}
        for i in range(len(batch)):
            report = by_name[f"g{i}"]
            if "Params" in report.fallbacks:
                out.append(None)
                continue
            module = importlib.import_module(f"{alias}.{sources.package}.{report.module}")
            out.append(module._arguments)
        return out
    finally:
        sys.path.remove(str(workdir))


def peer(group: Group, workdir: Path) -> Any | None:
    from datamodel_code_generator import GenerateConfig, generate
    from datamodel_code_generator.enums import DataModelType, InputFileType

    config = GenerateConfig(
        input_file_type=InputFileType.JsonSchema,
        output_model_type=DataModelType.PydanticV2BaseModel,
        class_name="Params",
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = generate(input_schema(group), config=config)
        if not isinstance(text, str):
            return None
        path = workdir / f"peer_{uuid.uuid4().hex}.py"
        path.write_text(text)
        module = import_file(path, path.stem)
        model = module.Params
        model.model_rebuild()
    except Exception:
        return None

    def send(data: Any) -> Any:
        return model.model_validate(data).model_dump(mode="json", by_alias=True, exclude_unset=True)

    return send


# ----------------------------------------------------------------------------------------------- main


def table(rows: dict[str, dict[str, Score]]) -> str:
    header = (
        "| set | side | groups | generated | instances | agreement | false rejects | false accepts "
        "| altered (of valid) |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for name, sides in rows.items():
        for side, s in sides.items():
            r = s.row()
            lines.append(
                f"| {name} | {side} | {r['groups']} | {r['generated_pct']}% | {r['instances']} | "
                f"{r['agreement_pct']}% | {r['false_rejects']} | {r['false_accepts']} | {r['altered']} / {r['valid']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    parser.add_argument("--sdist", type=Path, help="a jsonschema sdist (.tar.gz) to read the suite from")
    parser.add_argument("--json", type=Path, help="write the scores here as JSON")
    parser.add_argument(
        "--list-rejects", action="store_true", help="print every false reject and altered value of both sides"
    )
    parser.add_argument(
        "--list-accepts", action="store_true", help="print every false accept of both sides (invalid instances sent)"
    )
    parser.add_argument(
        "--modes",
        default="wrapped,direct,formats",
        help="comma-separated sets to run (wrapped, direct, formats); all by default",
    )
    args = parser.parse_args()
    modes = set(args.modes.split(","))

    started = time.perf_counter()
    archive = suite_archive(args.cache, args.sdist)
    all_groups, skipped = groups(archive)
    labelled: list[tuple[Group, list[bool]]] = []
    for group in all_groups:
        if group.mode not in modes:
            continue
        expected = oracle(group)
        if expected is None:
            skipped[group.label] = 1
        else:
            labelled.append((group, expected))
    print(f"{len(labelled)} groups from {archive.name}; {len(skipped)} skipped", file=sys.stderr)

    rows: dict[str, dict[str, Score]] = {}
    with tempfile.TemporaryDirectory(prefix="ipybox-fidelity-") as tmp:
        workdir = Path(tmp)
        by_file: dict[tuple[str, str, str], list[tuple[Group, list[bool]]]] = {}
        for group, expected in labelled:
            by_file.setdefault((group.draft, group.file, group.mode), []).append((group, expected))
        for (draft, file, mode), batch in sorted(by_file.items()):
            senders = ours([g for g, _ in batch], workdir)
            sets = [f"{draft} {mode}"]
            if file in MCP_KEYWORDS or file.startswith("format/"):
                sets.append(f"{draft} {mode}, MCP keywords")
            for (group, expected), send in zip(batch, senders, strict=True):
                mine, theirs = score(group, expected, send), score(group, expected, peer(group, workdir))
                for name in sets:
                    sides = rows.setdefault(name, {"ipybox": Score(), "datamodel-code-generator": Score()})
                    sides["ipybox"].add(mine)
                    sides["datamodel-code-generator"].add(theirs)
            print(f"  {draft} {mode} {file}: {len(batch)} groups", file=sys.stderr)

    print(table(rows))
    print(
        f"\nskipped: {len(skipped)} groups (remote refs, $id/anchors/dynamic refs, or the oracle cannot compile them)"
    )
    print(f"{time.perf_counter() - started:.0f} s")
    for wanted, title, attribute in (
        (args.list_rejects, "false rejects", "rejects"),
        (args.list_accepts, "false accepts", "accepts"),
    ):
        for name, sides in rows.items() if wanted else ():
            if "MCP" in name:
                continue
            for side, s in sides.items():
                print(f"\n## {title}, {side}, {name}")
                print("\n".join(cast("list[str]", getattr(s, attribute))))
    if args.json:
        args.json.write_text(
            json.dumps({n: {s: v.row() for s, v in sides.items()} for n, sides in rows.items()}, indent=1)
        )


if __name__ == "__main__":
    main()

"""Identifiers for MCP names, and deterministic collision resolution."""

from __future__ import annotations

import ast
import itertools
import keyword

import pytest

from ipybox.codegen._names import MAX_IDENTIFIER_LENGTH, Renamed, assign_identifiers, python_identifier
from ipybox.codegen._pysource import comment_text, docstring_literal, first_line


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("brave_search", "brave_search"),
        ("brave-search", "brave_search"),
        ("brave.search", "brave_search"),
        ("Brave Search", "brave_search"),
        ("getUser", "get_user"),
        ("HTTPServer", "http_server"),
        ("  --weird__name--  ", "weird_name"),
        ("café-crème", "cafe_creme"),
        ("1password", "tool_1password"),
        ("class", "class_"),
        ("match", "match_"),
        ("None", "none"),
        ("__init__", "init"),
        ("../../etc/passwd", "etc_passwd"),
    ],
)
def test_names_fold_to_snake_case_ascii_identifiers(name: str, expected: str) -> None:
    assert python_identifier(name, prefix="tool") == expected


@pytest.mark.parametrize("name", ["", "日本語", "---", "\x00", "🙂"])
def test_names_without_usable_characters_get_a_stable_hashed_identifier(name: str) -> None:
    identifier = python_identifier(name, prefix="server")
    assert identifier.startswith("server_") and identifier.isidentifier()
    assert identifier == python_identifier(name, prefix="server")
    assert python_identifier("日本語", prefix="x") != python_identifier("中文", prefix="x")


def test_very_long_names_are_cut_but_stay_distinct() -> None:
    a, b = "x" * 500 + "a", "x" * 500 + "b"
    ia, ib = python_identifier(a, prefix="tool"), python_identifier(b, prefix="tool")
    assert len(ia) <= MAX_IDENTIFIER_LENGTH and len(ib) <= MAX_IDENTIFIER_LENGTH and ia != ib


@pytest.mark.parametrize("name", ["a-b", "x" * 300, "1", "def", "é", "a\nb", "'); import os #", "\u2028"])
def test_every_identifier_is_a_valid_non_keyword_python_name(name: str) -> None:
    identifier = python_identifier(name, prefix="tool")
    assert identifier.isidentifier() and identifier.isascii()
    assert not keyword.iskeyword(identifier) and not keyword.issoftkeyword(identifier)


def test_collisions_are_resolved_the_same_way_in_any_listing_order() -> None:
    names = ["a-b", "a_b", "a.b", "getUser", "get user", "get_user_2"]
    results = {repr(assign_identifiers(order, prefix="tool")) for order in itertools.permutations(names)}
    assert len(results) == 1
    mapping, renamed = assign_identifiers(names, prefix="tool")
    # Names that already are identifiers keep them; the rest are numbered in sorted order.
    assert mapping == {
        "a_b": "a_b",
        "a-b": "a_b_2",
        "a.b": "a_b_3",
        "get_user_2": "get_user_2",
        "get user": "get_user",
        "getUser": "get_user_3",
    }
    assert renamed == [
        Renamed("a-b", "a_b_2", "a_b", "a_b"),
        Renamed("a.b", "a_b_3", "a_b", "a_b"),
        Renamed("getUser", "get_user_3", "get_user", "get user"),
    ]


def test_reserved_identifiers_are_never_handed_out() -> None:
    mapping, renamed = assign_identifiers(["run"], prefix="tool", reserved=["run"])
    assert mapping == {"run": "run_2"} and renamed == [Renamed("run", "run_2", "run", "")]


def test_duplicate_names_count_once() -> None:
    assert assign_identifiers(["x", "x"], prefix="tool") == ({"x": "x"}, [])


@pytest.mark.parametrize(
    "text",
    [
        '"""',
        'a"',
        '""""""',
        "\\",
        "\\n",
        "x\r\ny",
        "x\x00y",
        "x\u2028y",
        "'''",
        'a"""b"""',
        "tab\there",
        "é ✓",
    ],
)
def test_docstring_literals_evaluate_to_exactly_their_text(text: str) -> None:
    literal = docstring_literal(text)
    assert "\n" not in literal or literal.startswith('"""')
    value = ast.literal_eval(literal)
    assert value.replace("\n", "") == text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "")


def test_docstring_literals_are_single_statements_in_code() -> None:
    literal = docstring_literal('a"""\nimport os\n"""b', indent="    ")
    tree = ast.parse(f"def f():\n    {literal}\n    return 1\n")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef) and len(tree.body) == 1 and len(function.body) == 2


def test_comment_text_and_first_line_never_span_lines() -> None:
    assert comment_text("a\nb\rc\u2028d\x00e") == "a b c d e"
    assert first_line("\n\n  first line  \nsecond") == "first line"
    assert first_line("x" * 300, limit=10) == "x" * 9 + "…"
    assert first_line(None) == ""

"""Index terms of tool text: the words a search matches, shared by the index and its file.

Standard library only (the kernel's search uses it). Words are split at snake and camel case,
lower-cased, function words dropped and plural/verb endings stripped, so that "deleting files"
meets ``delete_file``. Each field is cut to a fixed number of words.
"""

from __future__ import annotations

import re

__all__ = (
    "DESCRIPTION_LIMIT",
    "DESCRIPTION_TERMS",
    "FIRST_LINE_CHARS",
    "NAME_TERMS",
    "PARAM_TERMS",
    "SERVER_TERMS",
    "TERMS_VERSION",
    "terms",
    "tool_fields",
)

# Index files (`ipybox_kernel._records`) store terms: change this number whenever what `terms` or
# `tool_fields` return for a text changes, so that files written before are read as stale.
TERMS_VERSION = 1

# One-line descriptions in matches: the length the host's stubs use for theirs.
DESCRIPTION_LIMIT = 120
# Where the first line of a description is looked for: generous, but not a whole huge docstring.
FIRST_LINE_CHARS = 4 * 1024

# Words per field beyond which the rest is not indexed. Real MCP descriptions are a few sentences
# (the longest in the benchmark catalogue has 84 words, 53 terms; parameters at most 29 terms);
# the caps keep a tool from covering the whole vocabulary, and the index's size bounded, whatever
# a server sends.
NAME_TERMS = 16
DESCRIPTION_TERMS = 160
PARAM_TERMS = 160
SERVER_TERMS = 8

# Characters read per word a field may keep: ample for real words and the spaces between them.
_CHARS_PER_TERM = 40

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
# Function words: they say nothing about what a tool does.
_FUNCTION_WORDS = (
    "a an and any are as at be by can could do does for from how i in into is it its me my of on or our please "
    "should so some than that the their them then there these this those to us was we what when where which while "
    "who will with would you your"
)
_STOPWORDS = frozenset(_FUNCTION_WORDS.split())


def _stem(word: str) -> str:
    """A light suffix stripper: query and index words go through the same one, so 'created',
    'creates' and 'create' meet; it need not be linguistically right, only consistent."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def terms(text: str, limit: int | None = None) -> list[str]:
    """The index terms of `text`: words split at snake and camel case, lower-cased and stemmed."""
    if limit is not None:
        # Words beyond the limit are dropped anyway; a huge text is not worth splitting whole.
        text = text[: limit * _CHARS_PER_TERM]
    found: list[str] = []
    for word in _WORD.findall(_CAMEL.sub(" ", text)):
        word = word.lower()
        if word not in _STOPWORDS:
            found.append(_stem(word))
            if limit is not None and len(found) >= limit:
                break
    return found


def tool_fields(module: str, tool: str, doc: str, params: list[tuple[str, str, str]]) -> dict[str, list[str]]:
    """The terms of one tool's own fields: name, description and parameters."""
    param_text = " ".join(f"{name} {alias} {description}" for name, alias, description in params)
    return {
        # The module name is the MCP name folded to an identifier: mostly the same words, counted once.
        "name": list(dict.fromkeys(terms(f"{tool} {module}", NAME_TERMS))),
        "description": terms(doc, DESCRIPTION_TERMS),
        "params": terms(param_text, PARAM_TERMS),
    }

"""What a generated module's ``run()`` returns for a tool without an output schema: `ToolText`.

A `ToolText` is the text the tool returned, a ``str`` as it always was, and also carries every content
item of the result, typed: text, image, audio, resource link, embedded resource (MCP wire JSON kept
in ``raw``). Standard library only, like the rest of ``ipybox_kernel``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from ._errors import ToolOutput

__all__ = (
    "AudioContent",
    "Content",
    "EmbeddedResource",
    "ImageContent",
    "OtherContent",
    "ResourceLink",
    "TextContent",
    "ToolText",
)

# Images Jupyter front ends render from a MIME bundle.
_RENDERED = frozenset({"image/png", "image/jpeg", "image/gif"})


def _decode(data: str | None) -> bytes:
    if data is None:
        return b""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the server sent content data that is not valid base64") from None


@dataclass(frozen=True)
class TextContent:
    """A text item. ``raw`` is the item as the server sent it (with ``annotations``, ``_meta``)."""

    text: str
    raw: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ImageContent:
    """An image: ``data`` is base64 as sent; `bytes` decodes it. Displays itself in Jupyter."""

    mime_type: str
    data: str = field(repr=False)
    raw: dict[str, Any] = field(repr=False, compare=False)

    def bytes(self) -> bytes:
        """The decoded image."""
        return _decode(self.data)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {self.mime_type: self.data} if self.mime_type in _RENDERED else {"text/plain": repr(self)}


@dataclass(frozen=True)
class AudioContent:
    """Audio: ``data`` is base64 as sent; `bytes` decodes it."""

    mime_type: str
    data: str = field(repr=False)
    raw: dict[str, Any] = field(repr=False, compare=False)

    def bytes(self) -> bytes:
        """The decoded audio."""
        return _decode(self.data)


@dataclass(frozen=True)
class ResourceLink:
    """A link to a resource the server has; read it with the server's own tools or resources."""

    uri: str
    name: str | None
    mime_type: str | None
    description: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class EmbeddedResource:
    """A resource sent in the result: ``text``, or ``blob`` (base64; `bytes` decodes either)."""

    uri: str
    mime_type: str | None
    text: str | None
    blob: str | None = field(repr=False)
    raw: dict[str, Any] = field(repr=False, compare=False)

    def bytes(self) -> bytes:
        """The resource's content: the blob decoded, or the text as UTF-8."""
        return self.text.encode() if self.text is not None else _decode(self.blob)


@dataclass(frozen=True)
class OtherContent:
    """An item of a type this version of ipybox does not know; ``raw`` holds it."""

    type: str
    raw: dict[str, Any] = field(repr=False, compare=False)


Content = TextContent | ImageContent | AudioContent | ResourceLink | EmbeddedResource | OtherContent


def _str(item: dict[str, Any], key: str) -> str | None:
    value = item.get(key)
    return value if isinstance(value, str) else None


def content_item(item: dict[str, Any]) -> Content:
    """One MCP content item (wire JSON) as its typed form."""
    kind = item.get("type")
    if kind == "text":
        return TextContent(_str(item, "text") or "", item)
    if kind == "image":
        return ImageContent(_str(item, "mimeType") or "", _str(item, "data") or "", item)
    if kind == "audio":
        return AudioContent(_str(item, "mimeType") or "", _str(item, "data") or "", item)
    if kind == "resource_link":
        return ResourceLink(
            _str(item, "uri") or "", _str(item, "name"), _str(item, "mimeType"), _str(item, "description"), item
        )
    resource = item.get("resource")
    if kind == "resource" and isinstance(resource, dict):
        fields: dict[str, Any] = resource  # pyright: ignore[reportUnknownVariableType]
        return EmbeddedResource(
            _str(fields, "uri") or "", _str(fields, "mimeType"), _str(fields, "text"), _str(fields, "blob"), item
        )
    return OtherContent(kind if isinstance(kind, str) else "", item)


class ToolText(str):
    """The text a tool returned, as a ``str``, with every content item of the result in `content`.

    Text-only results work as plain strings. A result with images, audio or resources also has
    them, typed, in ``content`` (and images in `images`); its ``repr`` lists them.

    Attributes:
        content: Every content item, in the order the tool sent them.
    """

    content: tuple[Content, ...]

    def __new__(cls, text: str = "", content: tuple[Content, ...] = ()) -> ToolText:
        self = super().__new__(cls, text)
        self.content = tuple(content)
        return self

    @classmethod
    def of(cls, output: ToolOutput) -> ToolText:
        """The text and typed content items of a tool call's output."""
        return cls(output.text, tuple(content_item(item) for item in output.content if isinstance(item, dict)))  # pyright: ignore[reportUnnecessaryIsInstance]

    @property
    def images(self) -> tuple[ImageContent, ...]:
        """The image items."""
        return tuple(item for item in self.content if isinstance(item, ImageContent))

    def __repr__(self) -> str:
        others = [item for item in self.content if not isinstance(item, TextContent)]
        if not others:
            return super().__repr__()
        return f"ToolText({super().__repr__()}, with {', '.join(map(repr, others))})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ToolText, (str(self), self.content))

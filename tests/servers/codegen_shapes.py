"""MCP server whose tools exercise code generation: awkward names, nested models, structured output.

Usage: ``python codegen_shapes.py [stdio|http|sse] [--variant changed|empty]``. Over HTTP and SSE it
binds 127.0.0.1 on a port the OS picks and prints ``URL <url>`` on stdout once it is listening.

Variants: ``changed`` drops one tool and changes another's description (for regeneration tests);
``empty`` lists no tools at all, only a resource and a prompt.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Literal

import anyio
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ConfigDict, Field
from test_server import serve_http


class In:
    class Item(BaseModel):
        """A line of an order."""

        sku: str = Field(description="Stock keeping unit")
        qty: int = Field(ge=1, description="How many")


class Out:
    # Same class name as In.Item, so both schemas of `rate` define "Item", with different fields.
    class Item(BaseModel):
        """A rated line."""

        label: str
        score: float


class Address(BaseModel):
    street: str
    city: str
    zip: str | None = Field(default=None, description="Postal code")


class Rating(BaseModel):
    total: float
    items: list[Out.Item]
    ship_to: Address
    tags: dict[str, str] = Field(default_factory=dict)


class Trip(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from", description="Where the trip starts")
    to: str


class Weather(BaseModel):
    temperature: float = Field(description="Degrees Celsius")
    conditions: Literal["sunny", "cloudy", "rain"]


def build(variant: str | None) -> MCPServer:
    server = MCPServer("codegen-shapes", version="1.0", instructions="Tools with awkward names and nested models.")
    if variant == "empty":
        # No tools, only a resource and a prompt.
        server.resource("docs://readme", name="readme", description="How the shapes are drawn.")(lambda: "Draw.")
        server.prompt(name="describe", description="Describe a shape.")(lambda: "Describe it.")
        return server

    @server.tool(name="rate", description="Rate an order.\n\nReturns a score per line.")
    def rate(items: list[In.Item], ship_to: Address, rush: bool = False) -> Rating:
        scored = [Out.Item(label=f"{i.sku}x{i.qty}", score=i.qty * (2.0 if rush else 1.0)) for i in items]
        return Rating(total=sum(s.score for s in scored), items=scored, ship_to=ship_to, tags={"rush": str(rush)})

    @server.tool(name="book", description="Book a trip; its fields are Python keywords.")
    def book(trip: Trip) -> str:
        return f"{trip.from_}->{trip.to}"

    @server.tool(name="get-weather", title="Weather", description="Current weather in a city.")
    def get_weather(city: str) -> Weather:
        return Weather(temperature=21.5 if city == "Berlin" else 30.0, conditions="sunny")

    @server.tool(name="echo", description="Echo the text back." if variant is None else "Echo it (changed).")
    def echo(text: str, times: int = 1, sep: str | None = " ") -> str:
        return (sep or "").join([text] * times)

    for name in ("a-b", "a_b", "class", "1st tool", "data.fetch", "getUser", "get user", "Ünïcödé", "日本語"):
        if variant == "changed" and name == "a-b":
            continue
        server.tool(name=name, description=f"Returns the tool's own name, {name!r}.")(_named(name))
    return server


def _named(name: str) -> Callable[[], str]:
    def tool() -> str:
        return name

    return tool


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", nargs="?", default="stdio", choices=["stdio", "http", "sse"])
    parser.add_argument("--variant", choices=["changed", "empty"])
    args = parser.parse_args()
    server = build(args.variant)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        anyio.run(partial(serve_http, server, args.transport, announce="URL"))
    sys.exit(0)


if __name__ == "__main__":
    main()

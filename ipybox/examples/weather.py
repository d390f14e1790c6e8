"""A small offline MCP server for the README's example and the demo: made-up weather for a few cities.

Run over stdio: ``python -m ipybox.examples.weather``.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

__all__ = ("get_forecast", "list_cities", "send_report", "server")

server = MCPServer("weather", instructions="Made-up, deterministic weather for a handful of cities.")

CITIES = {
    "berlin": "Germany",
    "lisbon": "Portugal",
    "nairobi": "Kenya",
    "oslo": "Norway",
    "sydney": "Australia",
    "tokyo": "Japan",
}


class City(BaseModel):
    name: str
    country: str


class Forecast(BaseModel):
    city: str
    temperature: float = Field(description="Temperature in the requested unit")
    unit: Literal["celsius", "fahrenheit"]
    conditions: Literal["sunny", "cloudy", "rain", "snow"]


def _seed(city: str) -> int:
    return int(hashlib.sha256(city.encode()).hexdigest()[:8], 16)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def list_cities() -> list[City]:
    """List the cities this server knows."""
    return [City(name=name, country=country) for name, country in sorted(CITIES.items())]


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_forecast(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> Forecast:
    """Today's forecast for a city (lower-case name, as listed by list_cities)."""
    if city not in CITIES:
        raise ValueError(f"unknown city {city!r}; call list_cities first")
    seed = _seed(city)
    celsius = round(-5 + (seed % 350) / 10, 1)
    conditions = ("sunny", "cloudy", "rain", "snow")[seed % 4 if celsius < 2 else seed % 3]
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return Forecast(city=city, temperature=temperature, unit=unit, conditions=conditions)


@server.tool(annotations=ToolAnnotations(destructive_hint=False, read_only_hint=False))
def send_report(recipient: str, subject: str, body: str) -> str:
    """Send a short weather report by e-mail (pretend: nothing leaves this machine)."""
    return f"report {subject!r} queued for {recipient} ({len(body)} characters)"


if __name__ == "__main__":
    server.run("stdio")

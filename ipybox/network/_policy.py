"""`Network`: which destinations kernel code may connect to, and how the host checks an address.

Matching rules (the docs page ``docs/network.md`` states them for users):

- A name entry (``example.org``) matches that name exactly, case-insensitively, a trailing dot
  ignored. ``*.example.org`` matches any name that ends in ``.example.org`` with at least one more
  label (``api.example.org``, ``a.b.example.org``), never ``example.org`` itself. ``*`` may only be
  the whole first label. Names are ASCII (IDNA ``xn--`` form for others).
- An address entry is an IPv4 or IPv6 address or network (``203.0.113.7``, ``10.0.0.0/8``,
  ``[2001:db8::1]``, ``2001:db8::/32``). It matches connections to that address literal, and it is
  the only way to let any connection reach a non-public address (below).
- Ports: an entry without one allows ports 80 and 443; ``:PORT`` allows that port, ``:*`` any.
  IPv6 entries with a port are bracketed: ``[2001:db8::1]:8443``, ``[2001:db8::/32]:*``.
- Non-public addresses (loopback, private, link-local incl. cloud metadata 169.254.169.254,
  CGNAT, multicast, unspecified, reserved, documentation ranges, and IPv4 addresses embedded in
  IPv6 forms such as ``::ffff:127.0.0.1``) and the host's own interface addresses are refused,
  whatever name led to them and whatever the application answered to an "ask", unless an address
  entry contains the address and allows the port. An entry that is a network (``10.0.0.0/8``,
  ``0.0.0.0/0``) does not reach the addresses that lead to the host or its cloud's metadata service
  (loopback, link-local, unspecified, ``0.0.0.0/8``, known metadata addresses, the host's own)
  unless ``Network.networks_reach_host``: only an entry naming the single address does. The
  unspecified address itself is no valid entry.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from ipybox._exceptions import UsageError

__all__ = (
    "DEFAULT_PORTS",
    "Entry",
    "Network",
    "NetworkEvent",
    "address_problem",
    "any_entry_allows",
    "host_problem",
    "normalize_host",
    "parse_entry",
)

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = frozenset({80, 443})
# One DNS label: letters, digits and inner hyphens; underscores occur in real service names.
HOST_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_ENTRY_HELP = (
    "write a host name ('example.org'), a wildcard ('*.example.org'), an address or network "
    "('203.0.113.7', '10.0.0.0/8', '[2001:db8::1]'), optionally with ':PORT' or ':*'"
)
# IPv6 forms that carry an IPv4 address the packet ends up at.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Linux connects to an address in 0.0.0.0/8 as to this host.
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
# Cloud instance metadata and host services that are not link-local: AWS over IPv6, Alibaba Cloud,
# Oracle Cloud (older instances), Azure's WireServer (a public address). 169.254.169.254 and the
# other link-local ones are refused as link-local.
_METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "192.0.0.192", "168.63.129.16")
)


@dataclass(frozen=True)
class Entry:
    """One parsed ``allow`` entry."""

    text: str
    name: str | None
    """The host name, or the wildcard's suffix (``.example.org``) when ``wildcard``."""
    wildcard: bool
    network: IPNetwork | None
    ports: frozenset[int] | None
    """None: any port."""

    def allows_port(self, port: int) -> bool:
        return self.ports is None or port in self.ports

    def matches_name(self, host: str) -> bool:
        if self.name is None:
            return False
        return host.endswith(self.name) and len(host) > len(self.name) if self.wildcard else host == self.name

    def contains(self, address: IPAddress) -> bool:
        return self.network is not None and address.version == self.network.version and address in self.network

    @property
    def exact(self) -> bool:
        """Whether it is a single address (not a wider network)."""
        return self.network is not None and self.network.num_addresses == 1


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no brackets around an IPv6 literal."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def parse_ip(host: str) -> IPAddress | None:
    """The address if ``host`` is an IP literal (no zone ids: those name a host interface)."""
    if "%" in host:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def parse_entry(text: str) -> Entry:
    """Parse one ``allow`` entry.

    Raises:
        UsageError: It is not a name, wildcard, address or network with an optional port.
    """
    if not isinstance(text, str) or not text.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"Network allow entry {text!r} is empty or not a string; {_ENTRY_HELP}")
    raw = text.strip()
    host, ports = _split_port(raw, text)
    host = normalize_host(host)
    try:
        network = ipaddress.ip_network(host, strict=True)
    except ValueError as exc:
        if "/" in host:
            fix = "write the network address, e.g. '10.0.0.0/8'"
            raise UsageError(f"Network allow entry {text!r}: {exc}; {fix}") from None
        network = None
    if network is not None:
        if network.num_addresses == 1 and network.network_address.is_unspecified:
            raise UsageError(
                f"Network allow entry {text!r} is the unspecified address, and connecting to it reaches "
                "this host itself; write '127.0.0.1' for the host's loopback, or '0.0.0.0/0' for every "
                "address but the host's"
            )
        return Entry(text=text, name=None, wildcard=False, network=network, ports=ports)
    wildcard = host.startswith("*.")
    name = host[1:] if wildcard else host
    labels = name[1:].split(".") if wildcard else name.split(".")
    if "*" in name or not all(HOST_LABEL.match(label) for label in labels) or len(name) > 253:
        raise UsageError(
            f"Network allow entry {text!r} is not a valid host name ('*' only as the whole first label, "
            f"ASCII letters, digits and hyphens; IDNA 'xn--' form for other names); {_ENTRY_HELP}"
        )
    if wildcard and len(labels) < 2:
        raise UsageError(f"Network allow entry {text!r} would match a whole top-level domain; name a domain under it")
    return Entry(text=text, name=name, wildcard=wildcard, network=None, ports=ports)


def _split_port(raw: str, text: str) -> tuple[str, frozenset[int] | None]:
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise UsageError(f"Network allow entry {text!r} has '[' without ']'; {_ENTRY_HELP}")
        host, rest = raw[: end + 1], raw[end + 1 :]
        if not rest:
            return host, DEFAULT_PORTS
        if not rest.startswith(":"):
            raise UsageError(f"Network allow entry {text!r}: only ':PORT' may follow ']'; {_ENTRY_HELP}")
        return host, _port(rest[1:], text)
    if raw.count(":") == 1:
        host, port = raw.split(":")
        return host, _port(port, text)
    return raw, DEFAULT_PORTS


def _port(port: str, text: str) -> frozenset[int] | None:
    if port == "*":
        return None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"Network allow entry {text!r}: the port must be 1-65535 or '*', got {port!r}")
    return frozenset({int(port)})


def any_entry_allows(entries: Sequence[Entry], host: str, port: int) -> bool:
    """Whether one of ``entries`` allows ``host`` (normalized: a name or an address literal) on ``port``."""
    address = parse_ip(host)
    for entry in entries:
        if not entry.allows_port(port):
            continue
        if entry.contains(address) if address is not None else entry.matches_name(host):
            return True
    return False


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not a public destination, or None if it is one."""
    for addr, label in _forms(address):
        for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
            if getattr(addr, f"is_{kind}"):
                return f"{label} is {_a(kind)} {kind.replace('_', '-')} address"
        if addr in _METADATA:
            return f"{label} is a cloud metadata address"
        if not addr.is_global:
            return f"{label} is not a public address (shared/CGNAT or special-purpose)"
    if _is_own_address(address):
        return f"{address} is an address of the host itself"
    return None


def host_problem(address: IPAddress) -> str | None:
    """Why ``address`` leads to this host or its cloud's metadata service (loopback, link-local,
    unspecified, a metadata address, one of the host's own), or None: what a network entry does
    not reach without ``Network.networks_reach_host``."""
    for addr, label in _forms(address):
        for kind in ("loopback", "link_local", "unspecified"):
            if getattr(addr, f"is_{kind}"):
                return f"{label} is {_a(kind)} {kind.replace('_', '-')} address"
        if addr in _METADATA:
            return f"{label} is a cloud metadata address"
        if addr in _THIS_NETWORK:
            return f"{label} is in 0.0.0.0/8, which leads to this host"
    if _is_own_address(address):
        return f"{address} is an address of the host itself"
    return None


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _forms(address: IPAddress) -> list[tuple[IPAddress, str]]:
    """``address`` with a label, preceded by the IPv4 address an IPv6 form carries, if any: that is
    where the packets go."""
    forms: list[tuple[IPAddress, str]] = [(address, str(address))]
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is None and int(address) >> 32 == 0 and int(address) > 1:
            embedded = ipaddress.IPv4Address(int(address))  # IPv4-compatible (deprecated) form
        if embedded is not None:
            forms.insert(0, (embedded, f"{address} (IPv4 {embedded})"))
    return forms


def _is_own_address(address: IPAddress) -> bool:
    """Whether this host has ``address`` on one of its interfaces: binding to it succeeds only then
    (stdlib has no getifaddrs; unless the host sets ``net.ipv4.ip_nonlocal_bind``)."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
    except OSError as exc:
        return exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
    return True


@dataclass(frozen=True)
class NetworkEvent:
    """Something the executor's network proxy decided; passed to ``Network.on_event`` and logged
    on the ``ipybox.network`` logger (the fields are the record's ``extra``).

    Attributes:
        kind: ``"allowed"`` (a connection was opened), ``"denied"`` (refused: ``reason`` says why),
            ``"asked"`` (an approval request was made), ``"answered"`` (its decision), ``"limit"``
            (a limit ended or refused a connection), ``"closed"`` (a connection ended; ``bytes``
            holds what it carried).
        host: The destination as kernel code named it.
        port: The destination port.
        execution_id: The execution the connection belongs to (None: none was running).
        address: The address connected to, once resolved and checked.
        reason: Why it was denied, or what limit was hit.
        bytes: Bytes carried in both directions (``closed`` and ``limit`` events).
    """

    kind: Literal["allowed", "denied", "asked", "answered", "limit", "closed"]
    host: str
    port: int
    execution_id: str | None = None
    address: str | None = None
    reason: str | None = None
    bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class Network:
    """Network egress for kernel code: the destinations it may connect to, through the host.

    Without a `Network` the sandboxed kernel has no network at all. With one, HTTP(S) clients in
    the kernel (urllib, requests, httpx, pip) reach the allowed destinations through a proxy the
    host runs for the executor; names are resolved and every address is checked on the host. See
    the module docs (``docs/network.md``) for the exact matching rules.

    Attributes:
        allow: Destinations kernel code may connect to: host names (``"pypi.org"``), wildcards
            (``"*.example.org"``), addresses and networks (``"203.0.113.7"``, ``"10.0.0.0/8"``),
            each optionally with ``":PORT"`` or ``":*"`` (default: ports 80 and 443). An address
            entry is the only way to allow a non-public address (loopback, private, link-local...).
        unlisted: What happens to a destination not in ``allow``: ``"deny"``, or ``"ask"`` (an
            approval request, `NetworkRequest`, decided like tool calls).
        max_connections: Connections open at once for the executor; more are refused.
        max_bytes: Bytes one execution may move through the proxy, both directions together;
            None for no limit. Past it the execution's connections are closed.
        connect_timeout: Seconds to resolve a name and connect.
        idle_timeout: Seconds a connection may carry nothing before it is closed.
        hosts: Names the proxy resolves to the given address instead of asking DNS (like
            ``/etc/hosts`` lines for the proxy alone): internal services without DNS, pinned
            addresses. It changes where a name leads, not what is allowed: the name must still be
            allowed, and a non-public address still needs an address entry.
        on_event: Called with every `NetworkEvent` (on the event loop; keep it quick). A failing
            callback is logged, and the decision stands.
        networks_reach_host: Whether network entries (``10.0.0.0/8``, ``0.0.0.0/0``) also reach
            the host's loopback, link-local addresses (cloud metadata at ``169.254.169.254``), other
            cloud metadata addresses and the host's own addresses inside them. Off (the default),
            only an entry naming the single address reaches one of those.
    """

    allow: Sequence[str] = ()
    unlisted: Literal["deny", "ask"] = "deny"
    max_connections: int = 16
    max_bytes: int | None = 256 * 1024 * 1024
    connect_timeout: float = 10.0
    idle_timeout: float = 60.0
    hosts: Mapping[str, str] = field(default_factory=dict[str, str])
    on_event: Callable[[NetworkEvent], object] | None = None
    networks_reach_host: bool = False
    entries: tuple[Entry, ...] = field(init=False, repr=False, compare=False)
    pinned: Mapping[str, IPAddress] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.allow, str):
            fix = f"write allow=[{self.allow!r}]"
            raise UsageError(f"Network allow takes a list of entries, not a single string: {fix}")
        object.__setattr__(self, "allow", tuple(self.allow))
        object.__setattr__(self, "entries", tuple(parse_entry(text) for text in self.allow))
        if self.unlisted not in ("deny", "ask"):
            raise UsageError(f"Network unlisted must be 'deny' or 'ask', got {self.unlisted!r}")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"Network max_connections must be an int >= 1, got {self.max_connections!r}")
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or self.max_bytes < 1):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"Network max_bytes must be an int >= 1 or None, got {self.max_bytes!r}")
        for name in ("connect_timeout", "idle_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise UsageError(f"Network {name} must be a positive number of seconds, got {value!r}")
        pinned: dict[str, IPAddress] = {}
        for name, value in dict(self.hosts).items():
            entry = parse_entry(name) if isinstance(name, str) else None  # pyright: ignore[reportUnnecessaryIsInstance]
            address = parse_ip(normalize_host(value)) if isinstance(value, str) else None  # pyright: ignore[reportUnnecessaryIsInstance]
            if entry is None or entry.name is None or entry.wildcard or entry.ports != DEFAULT_PORTS or address is None:
                raise UsageError(
                    f"Network hosts maps host names (no wildcard, no port) to IP addresses; {name!r}: {value!r} "
                    "is not one, e.g. hosts={'db.internal': '10.0.0.5'}"
                )
            pinned[entry.name] = address
        object.__setattr__(self, "hosts", MappingProxyType(dict(self.hosts)))
        object.__setattr__(self, "pinned", MappingProxyType(pinned))
        if not isinstance(self.networks_reach_host, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"Network networks_reach_host must be True or False, got {self.networks_reach_host!r}")
        if self.on_event is not None and not callable(self.on_event):
            raise UsageError(f"Network on_event must be callable or None, got {self.on_event!r}")

    def listed(self, host: str, port: int) -> bool:
        """Whether an entry allows ``host`` (normalized) on ``port``."""
        return any_entry_allows(self.entries, host, port)

    def refusal(self, address: IPAddress, port: int) -> str | None:
        """Why connections may not reach ``address`` on ``port`` (whatever name led there), or None.

        A public address may be reached. Any other only through an address entry that contains it
        and allows the port; if that entry is a network (more than one address), not when the
        address leads to the host or its metadata service (`host_problem`), unless
        ``networks_reach_host``.
        """
        problem = address_problem(address)
        if problem is None:
            return None
        entries = [entry for entry in self.entries if entry.contains(address) and entry.allows_port(port)]
        if not entries:
            return f"{problem}; only an address entry in Network.allow reaches it"
        if self.networks_reach_host or any(entry.exact for entry in entries):
            return None
        problem = host_problem(address)
        if problem is None:
            return None
        return (
            f"{problem}, inside the network entry {entries[0].text!r}; network entries reach the host's "
            "loopback, link-local, metadata and own addresses only with Network(networks_reach_host=True), "
            "or list the address itself"
        )

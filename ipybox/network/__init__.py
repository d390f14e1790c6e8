"""Network egress for the sandboxed kernel: an allowlist enforced by a proxy on the host.

The public names (`Network`, `NetworkEvent`, `NetworkRequest`) are exported from ``ipybox``; this
package imports nothing itself, so naming `Network` does not load the proxy. See ``docs/network.md``.
"""

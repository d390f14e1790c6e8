# A gateway config file that turns Nagle's algorithm off on the kernel websockets.
#
# Tornado writes each Jupyter message as its own small frame; with Nagle's algorithm on, every small
# write after the first waits for the client's acknowledgement (delayed by up to 40 ms), which adds
# tens of milliseconds to every execution and tool call. Load with
#   jupyter kernelgateway --config=nodelay_config.py        (or jupyter enterprisegateway ...)
# Config files are Python run at start-up; this one changes no setting, it patches the handler.
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

_open = KernelWebsocketHandler.open


def _open_without_nagle(self, *args, **kwargs):
    self.set_nodelay(True)
    return _open(self, *args, **kwargs)


KernelWebsocketHandler.open = _open_without_nagle

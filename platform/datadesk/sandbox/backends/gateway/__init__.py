"""The `gateway` backend: kernels on a Jupyter Kernel Gateway or Enterprise Gateway
(`remote.py`), their websocket (`channel.py`), and the `sandbox.gateway_*` settings with the
path mapping between app and kernels (`config.py`)."""

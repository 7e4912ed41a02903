"""What the cluster set keeps in the object store: the blob client with its per-host cache
(`blobs.py`), artifact rows over their objects (`artifacts.py`) and the presigned hand-over of
a thread's files to kernels without a shared volume (`kernelfiles.py`)."""

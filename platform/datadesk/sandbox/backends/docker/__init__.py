"""The `docker` backend: one locked-down container per kernel (`container.py`), who can reach
it and what it may ask of the host's kernel (`confinement.py`), and the kernel image it runs
(`image.py`, standard library only: `sandbox_image/build.sh` runs it from a plain checkout)."""

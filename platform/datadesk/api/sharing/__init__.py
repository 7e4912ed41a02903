"""The share endpoints (`controller.py`) and what a shared thread shows its readers (`reads.py`)."""

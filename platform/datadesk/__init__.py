"""DataDesk: a self-hosted data-analysis chat for analysts."""

__version__ = "0.1.0"

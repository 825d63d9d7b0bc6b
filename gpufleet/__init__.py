"""gpufleet: GPU fleet observability and utilization analytics."""

__version__ = "0.1.0"

"""`gpufleet demo`: the whole pipeline on a simulated fleet, with no GPU and no root (see run.py)."""

from gpufleet.demo.run import add_arguments, run

__all__ = ["add_arguments", "run"]

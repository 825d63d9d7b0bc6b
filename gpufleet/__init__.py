"""gpufleet: GPU fleet observability and utilization analytics.

One import root. `gpufleet.config`, `.times`, `.procs` and `.version` are the kernel every part may
use; `gpufleet.cli` and `gpufleet.demo` are the shell on top of every part. The parts live in the
repository's top-level folders and install here: `gpufleet.exporter`, `.collector`, `.analytics`,
`.report` and `.dashboards` (see pyproject.toml's package-dir).
"""

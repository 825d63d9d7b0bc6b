"""Real components on loopback for the test suite: Prometheus, Alertmanager, Slurm with accounting.

Why real ones: the contracts that matter here (PromQL over our exposition, alert rules, what Slurm
puts in a prolog's environment, what sacct reports) are other programs' behaviour. A fake would
encode our assumptions about them, which is exactly what these tests must check.

Modules:
  policy      -- what to do when a component is unavailable (skip locally, fail under CI=true)
  debian      -- install the Debian packages that provide the components (as root)
  process     -- start/wait/stop a daemon we own, free loopback ports
  prometheus  -- Prometheus, promtool, Alertmanager, amtool
  slurm       -- single-node Slurm + slurmdbd + MariaDB + munge with 8 fake GPUs

Fixtures that use these live in tests/conftest.py.
"""

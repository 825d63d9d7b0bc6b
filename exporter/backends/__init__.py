"""GPU backends: NVML for real nodes, a simulator for everything else."""

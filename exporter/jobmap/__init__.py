"""Job-to-GPU mapping sources: Slurm mapping files, process cgroups, kubelet pod-resources."""

# Shared by prolog.sh and epilog.sh: settings and locking for the job-mapping directory.
# Settings come from node.conf beside the scripts, else /etc/gpufleet/node.conf (shell syntax):
#   JOB_MAP_DIR=/run/gpufleet/job-mapping      # the exporter's --job-map-dir (dcgm-exporter's --hpc-job-mapping-dir)
#   DEVICE_MAP=/run/gpufleet/gpu-devices.tsv   # written by the gpufleet exporter: index minor uuid pci_bus_id
#   GRES_DEVICES="/dev/nvidia3 /dev/nvidia5"   # optional: this node's gres.conf gpu File= devices, in
#                                              # gres.conf order (the order `slurmd -G` prints them);
#                                              # unset: the prolog asks `slurmd -G` (see prolog.sh)
#   SLURMD=/opt/slurm/sbin/slurmd              # optional: slurmd for `slurmd -G`, if not on PATH below
#   SLURMD_TIMEOUT=10                          # optional: seconds allowed for `slurmd -G`
# Slurm runs a prolog/epilog with no PATH at all: the scripts set PATH before sourcing this file.
JOB_MAP_DIR=/run/gpufleet/job-mapping
DEVICE_MAP=/run/gpufleet/gpu-devices.tsv
GRES_DEVICES=
SLURMD=
SLURMD_TIMEOUT=10
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for conf in "$here/node.conf" /etc/gpufleet/node.conf; do
    if [ -r "$conf" ]; then . "$conf"; break; fi
done

# To syslog when there is one, and always to stderr (Slurm drops it; a wrapper or a test can keep it).
log() {
    echo "gpufleet-jobmap: $*" >&2
    logger -t gpufleet-jobmap -- "$*" 2>/dev/null || true
}

# Run "$@" holding an exclusive lock on the mapping directory: jobs sharing a GPU start and end concurrently.
with_lock() {
    mkdir -p "$JOB_MAP_DIR" || { log "cannot create $JOB_MAP_DIR"; return 1; }
    (
        flock -w 10 9 || { log "timed out waiting for $JOB_MAP_DIR/.lock"; exit 1; }
        "$@"
    ) 9>"$JOB_MAP_DIR/.lock"
}

# Rewrite one mapping file without the given job id; drop the file when no job is left.
remove_job_from() {
    local file="$1" job="$2" tmp
    tmp="$JOB_MAP_DIR/.$(basename "$file").tmp"
    grep -vx -- "$job" "$file" > "$tmp" || true
    if [ -s "$tmp" ]; then mv -f "$tmp" "$file"; else rm -f "$tmp" "$file"; fi
}

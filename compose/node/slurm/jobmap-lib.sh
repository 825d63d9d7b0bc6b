# Shared by prolog.sh and epilog.sh: settings and locking for the job-mapping directory.
# Settings come from node.conf beside the scripts, else /etc/gpufleet/node.conf (shell syntax):
#   JOB_MAP_DIR=/run/gpufleet/job-mapping      # the exporter's --job-map-dir (dcgm-exporter's --hpc-job-mapping-dir)
#   DEVICE_MAP=/run/gpufleet/gpu-devices.tsv   # written by the gpufleet exporter: index minor uuid pci_bus_id
JOB_MAP_DIR=/run/gpufleet/job-mapping
DEVICE_MAP=/run/gpufleet/gpu-devices.tsv
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for conf in "$here/node.conf" /etc/gpufleet/node.conf; do
    if [ -r "$conf" ]; then . "$conf"; break; fi
done

log() { logger -t gpufleet-jobmap -- "$*" 2>/dev/null || echo "gpufleet-jobmap: $*" >&2; }

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

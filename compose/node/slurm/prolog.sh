#!/bin/bash
# gpufleet Slurm prolog: record which job holds which GPU, in dcgm-exporter's job-mapping format,
# so the gpufleet exporter and dcgm-exporter (--hpc-job-mapping-dir) both label the job's GPUs.
#
# slurm.conf:  Prolog=/etc/gpufleet/slurm/prolog.sh
#              Epilog=/etc/gpufleet/slurm/epilog.sh
#              PrologFlags=Alloc        # run at allocation, so salloc/interactive jobs are mapped too
#
# Slurm names GPUs by device minor number (SLURM_JOB_GPUS, from gres.conf File=/dev/nvidiaN); the
# mapping files are named by NVML index. The two differ on many nodes, so the minor number is
# translated through the exporter's device map (or the driver's /proc entries and nvidia-smi);
# a GPU that cannot be translated is logged and left out, never guessed.
# The prolog always exits 0: a mapping problem must not drain the node or fail the job.
. "$(dirname "$0")/jobmap-lib.sh"

job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-}}"
[ -n "$job" ] && [ -n "$gpus" ] || exit 0

# minor number -> NVML index
declare -A index_of
if [ -r "$DEVICE_MAP" ]; then
    while read -r idx minor _rest; do
        case "$idx" in ''|\#*) continue ;; esac
        [ "$minor" != "-" ] && index_of[$minor]=$idx
    done < "$DEVICE_MAP"
elif command -v nvidia-smi >/dev/null 2>&1 && [ -d /proc/driver/nvidia/gpus ]; then
    declare -A index_of_bus
    while IFS=', ' read -r idx bus; do
        index_of_bus[${bus,,}]=$idx
    done < <(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null)
    for info in /proc/driver/nvidia/gpus/*/information; do
        bus="$(basename "$(dirname "$info")")"; bus="${bus,,}"
        minor="$(awk -F: '/Device Minor/ {gsub(/ /, "", $2); print $2}' "$info")"
        for key in "${!index_of_bus[@]}"; do
            # nvidia-smi prints 00000000:3B:00.0, /proc uses 0000:3b:00.0
            [ "${key: -12}" = "${bus: -12}" ] && index_of[$minor]=${index_of_bus[$key]}
        done
    done
fi

record() {
    local minor idx
    for minor in ${gpus//,/ }; do
        idx="${index_of[$minor]:-}"
        if [ -z "$idx" ]; then
            log "job $job: no NVML index known for GPU minor number $minor (is the gpufleet exporter running and writing $DEVICE_MAP?); not mapped"
            continue
        fi
        grep -qsx -- "$job" "$JOB_MAP_DIR/$idx" || echo "$job" >> "$JOB_MAP_DIR/$idx"
    done
}
with_lock record
exit 0

#!/bin/bash
# gpufleet Slurm prolog: record which job holds which GPU, in dcgm-exporter's job-mapping format,
# so the gpufleet exporter and dcgm-exporter (--hpc-job-mapping-dir) both label the job's GPUs.
#
# slurm.conf:  Prolog=/etc/gpufleet/slurm/prolog.sh
#              Epilog=/etc/gpufleet/slurm/epilog.sh
#              PrologFlags=Alloc        # run at allocation, so salloc/interactive jobs are mapped too
#
# SLURM_JOB_GPUS (like CUDA_VISIBLE_DEVICES and the IDX: of `scontrol show job -d`) holds Slurm's
# GRES *indices*: each GPU's position among this node's gpu devices in gres.conf (0, 1, 2, ...).
# That is neither the device minor number (the N of /dev/nvidiaN) nor the NVML index the mapping
# files are named by. Seen with Slurm 22.05 and gres.conf File=/dev/nvidia3,5,8,9,10,...: a job
# holding /dev/nvidia9 and /dev/nvidia10 gets SLURM_JOB_GPUS=3,4 (and 3 is the minor of another
# GPU). Where minors are 0..N-1 in gres.conf order the numbers coincide, which hides the mix-up.
# So each index is translated in three steps:
#   1. Slurm index i -> the node's i-th gpu device file, from (first that is available)
#        a. GRES_DEVICES in node.conf: "/dev/nvidia3 /dev/nvidia5 ..." in gres.conf order;
#        b. `slurmd -G` (Slurm's own merged slurm.conf+gres.conf view, with the prolog's SLURM_CONF):
#           the File= of its Name=gpu lines in the order printed, which is the index order. It
#           takes ~20 ms (slurmd 22.05 without AutoDetect; not measured with AutoDetect=nvml), waits
#           ~20 s and fails if a File= is missing, hence SLURMD_TIMEOUT. It does not disturb the
#           running slurmd, though it appends its config warnings to SlurmdLogFile. Its "Index="
#           is the number in the file name, not Slurm's index: only the line order counts. A gpu
#           line without exactly one file (MIG, Count>1) keeps its positions but is not mappable;
#        c. neither: logged, and no GPU is mapped (an index is never taken for a minor number).
#   2. device file -> minor number: stat of the character device. Only when the path is not a
#      character device here is the N of .../nvidiaN used (which is how slurmd itself numbers
#      gres.conf files); that is logged.
#   3. minor number -> NVML index: the exporter's device map (index minor uuid pci_bus_id), or,
#      without one, the driver's /proc/driver/nvidia/gpus/*/information joined with nvidia-smi.
# A GPU that cannot be translated at any step is logged and left out, never guessed.
# The prolog always exits 0: a mapping problem must not drain the node or fail the job.

# Slurm runs the prolog with no PATH at all.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
. "$(dirname "$0")/jobmap-lib.sh"

job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-}}"
[ -n "$job" ] && [ -n "$gpus" ] || exit 0

# ---- step 3's table first (without it nothing can be mapped): minor number -> NVML index
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
if [ "${#index_of[@]}" -eq 0 ]; then
    log "job $job: no minor number -> NVML index table (is the gpufleet exporter running and writing $DEVICE_MAP?); GPUs $gpus not mapped"
    exit 0
fi

# ---- step 1: devices[i] = the device file of Slurm GPU index i ("?" = no single device file)
devices=()
devices_from=
if [ -n "$GRES_DEVICES" ]; then
    read -r -a devices <<< "$GRES_DEVICES"
    devices_from="GRES_DEVICES in node.conf"
else
    slurmd_bin="${SLURMD:-$(command -v slurmd)}"
    if [ -z "$slurmd_bin" ]; then
        log "job $job: no slurmd on PATH=$PATH to ask for the node's GPU devices; set GRES_DEVICES or SLURMD in node.conf"
    else
        rc=0
        out="$(timeout "$SLURMD_TIMEOUT" "$slurmd_bin" -G ${SLURMD_NODENAME:+-N "$SLURMD_NODENAME"} 2>&1 < /dev/null)" || rc=$?
        if [ "$rc" -ne 0 ]; then
            log "job $job: '$slurmd_bin -G' failed (exit $rc, SLURM_CONF=${SLURM_CONF:-unset}): $(tail -n 3 <<< "$out" | tr '\n' ' ')"
        else
            while read -r line; do
                [[ " $line " == *" Name=gpu "* ]] || continue
                count=1 file=
                [[ "$line" =~ (^|[[:space:]])Count=([0-9]+)([[:space:]]|$) ]] && count=${BASH_REMATCH[2]}
                [[ "$line" =~ (^|[[:space:]])File=([^[:space:]]+) ]] && file=${BASH_REMATCH[2]}
                if [ "$count" = 1 ] && [ -n "$file" ] && [[ "$file" != *[,\[]* ]]; then
                    devices+=("$file")
                else
                    for ((k = 0; k < count; k++)); do devices+=("?"); done
                fi
            done <<< "$out"
            devices_from="slurmd -G"
        fi
    fi
fi
if [ "${#devices[@]}" -eq 0 ]; then
    log "job $job: cannot tell which devices Slurm's GPU indices $gpus are (no GRES_DEVICES in node.conf, no gpu File= from slurmd -G); not mapped"
    exit 0
fi

# ---- step 2: device file -> minor number
minor_of() {
    local dev="$1" hex
    if [ -c "$dev" ]; then
        hex="$(stat -L -c '%T' -- "$dev" 2>/dev/null)" || hex=
        if [[ "$hex" =~ ^[0-9a-fA-F]+$ ]]; then echo $((16#$hex)); return 0; fi
    fi
    if [[ "${dev##*/}" =~ ^nvidia([0-9]+)$ ]]; then
        log "job $job: $dev is not a character device here; taking minor number ${BASH_REMATCH[1]} from its name"
        echo $((10#${BASH_REMATCH[1]}))
        return 0
    fi
    return 1
}

targets=()
for part in ${gpus//,/ }; do
    if [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]]; then range=$(seq "$((10#${BASH_REMATCH[1]}))" "$((10#${BASH_REMATCH[2]}))")
    elif [[ "$part" =~ ^[0-9]+$ ]]; then range=$((10#$part))
    else log "job $job: '$part' in SLURM_JOB_GPUS=$gpus is not a GPU index; ignored"; continue
    fi
    for i in $range; do
        dev="${devices[$i]:-}"
        if [ -z "$dev" ] || [ "$dev" = "?" ]; then
            log "job $job: Slurm GPU index $i has no single device file in $devices_from (${#devices[@]} entries); not mapped"
            continue
        fi
        if ! minor="$(minor_of "$dev")"; then
            log "job $job: cannot tell the minor number of $dev (Slurm GPU index $i, from $devices_from); not mapped"
            continue
        fi
        idx="${index_of[$minor]:-}"
        if [ -z "$idx" ]; then
            log "job $job: no NVML index known for $dev, minor number $minor (Slurm GPU index $i); not mapped"
            continue
        fi
        targets+=("$idx")
    done
done
[ "${#targets[@]}" -gt 0 ] || exit 0

record() {
    local idx
    for idx in "${targets[@]}"; do
        grep -qsx -- "$job" "$JOB_MAP_DIR/$idx" || echo "$job" >> "$JOB_MAP_DIR/$idx"
    done
}
with_lock record
exit 0

#!/bin/bash
# gpufleet Slurm epilog: remove the ending job from every GPU's job-mapping file (see prolog.sh).
# It needs no GPU translation: it drops the job id from whichever files hold it. Always exits 0.

# Slurm runs the epilog with no PATH at all.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
. "$(dirname "$0")/jobmap-lib.sh"

job="${SLURM_JOB_ID:-}"
[ -n "$job" ] || exit 0

clear_job() {
    local f
    for f in "$JOB_MAP_DIR"/*; do
        [ -f "$f" ] || continue
        grep -qsx -- "$job" "$f" && remove_job_from "$f" "$job"
    done
    return 0
}
with_lock clear_job
exit 0

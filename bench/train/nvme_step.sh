#!/usr/bin/env bash
# The NVMe phase of an NVMe-bound strata train step against fio on the same drive, in one run.
#
#   bench/train/nvme_step.sh CONFIG.json [strata train options...]
#   bench/train/nvme_step.sh configs/zero3_nvme.json --model 3b --text README.md --steps 3 --seq-len 64 \
#       --backend host --device-memory-cap 1GiB        (one line; nvme_path must be a directory here)
#
# 1. strata train runs with the given config; its summary's "nvme" line gives the bytes a step reads and
#    writes on the swap files and the seconds a step the drive was busy (at least one request in flight).
# 2. fio then measures, in the config's nvme_path, sequential writes and reads on a file of a step's read
#    bytes (at least 1 GiB) with the config's aio.block_size and aio.queue_depth, io_uring, O_DIRECT, its
#    page cache dropped (invalidate=1), 20 s each after a 2 s ramp: the drive's rate for the swap
#    pipeline's pattern. The swap files themselves are gone when strata train ends (its run directory is
#    removed), so fio writes its own file beside where they were.
# 3. Prints the step's NVMe phase against read bytes / fio's read rate + written bytes / fio's write rate.
#
# Needs fio (apt-get install fio), python3, and build/tools/strata (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,17p "$0"; exit 2; }
config="$1"
shift
command -v fio > /dev/null || { echo "nvme_step: fio is not installed (apt-get install fio)" >&2; exit 1; }
strata=build/tools/strata
[ -x "$strata" ] || { echo "nvme_step: $strata is not built (scripts/build.sh)" >&2; exit 1; }

read -r nvme_path block depth < <(python3 - "$config" << 'EOF'
import json, re, sys
c = json.load(open(sys.argv[1]))
z = c.get("zero_optimization", {})
path = z.get("offload_optimizer", {}).get("nvme_path") or z.get("offload_param", {}).get("nvme_path")
if not path:
    sys.exit("nvme_step: the config has no offload nvme_path")
def size(v):
    if isinstance(v, (int, float)):
        return int(v)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]i?B?)?\s*", str(v))
    mult = {None: 1, "K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
    return int(float(m.group(1)) * mult.get(m.group(2), 1))
aio = c.get("aio", {})
print(path, size(aio.get("block_size", 1 << 20)), int(aio.get("queue_depth", 8)))
EOF
)

log=$(mktemp)
trap 'rm -f "$log"; rm -f "$nvme_path/nvme_step.fio"' EXIT
echo "nvme_step: strata train --config $config $* --no-progress"
/usr/bin/time -v "$strata" train --config "$config" "$@" --no-progress 2>&1 | tee "$log"
line=$(grep -E '^  nvme +' "$log" || true)
[ -n "$line" ] || { echo "nvme_step: the summary has no nvme line (no NVMe I/O during the steps?)" >&2; exit 1; }

# "read 7.21 GiB, written 6.02 GiB; the drive busy 41.3s of the step's 60.2s"
read -r rd wr busy step < <(python3 - "$line" << 'EOF'
import re, sys
u = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
m = re.search(r"read ([0-9.]+) (\w+), written ([0-9.]+) (\w+); the drive busy ([0-9.]+)s of the step's ([0-9.]+)s",
              sys.argv[1])
print(int(float(m.group(1)) * u[m.group(2)]), int(float(m.group(3)) * u[m.group(4)]), m.group(5), m.group(6))
EOF
)

size=$(( rd > (1 << 30) ? rd : (1 << 30) ))
size=$(( size / block * block ))
fio_rate() {  # $1: write or read; GB/s
  fio --name=nvme_step --filename="$nvme_path/nvme_step.fio" --size="$size" --bs="$block" --iodepth="$depth" \
    --ioengine=io_uring --direct=1 --invalidate=1 --rw="$1" --time_based --runtime=20 --ramp_time=2 \
    --output-format=json |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k=sys.argv[1]; print(j[k]["bw_bytes"]/1e9)' "$1"
}
fw=$(fio_rate write)
fr=$(fio_rate read)
python3 - "$rd" "$wr" "$busy" "$step" "$fr" "$fw" "$block" "$depth" "$nvme_path" << 'EOF'
import sys
rd, wr, busy, step, fr, fw = (float(x) for x in sys.argv[1:7])
block, depth, path = sys.argv[7], sys.argv[8], sys.argv[9]
ideal = rd / 1e9 / fr + wr / 1e9 / fw
print(f"\nnvme_step: {path}, block {block} B, depth {depth}")
print(f"  a step: read {rd / 1e9:.2f} GB, written {wr / 1e9:.2f} GB; the drive busy {busy:.2f} s of {step:.2f} s")
print(f"  fio: read {fr:.3f} GB/s, write {fw:.3f} GB/s -> the same bytes at fio's rates take {ideal:.2f} s")
print(f"  the step's NVMe phase / fio's time: {busy / ideal:.2f}x (issue 30 asks <= 1.25x)")
EOF

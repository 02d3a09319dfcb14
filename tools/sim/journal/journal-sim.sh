#!/usr/bin/env bash
# Appends real journal entries to DIR/sim.journal with systemd-journal-remote, for `make run`
# and by hand. The boot ID is this machine's (so the supervisor takes the file's newest boot
# as the current one) unless --boot is given; timestamps are now / the uptime.
#
#   journal-sim.sh DIR xid PCI XID [detail]      NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', …
#   journal-sim.sh DIR uuid PCI GPU-UUID         NVRM: GPU at PCI:0000:3b:00: GPU-…
#   journal-sim.sh DIR reset GPU-UUID            GPU reset occurred: GPU-… (SYSLOG_IDENTIFIER=gpu-reset)
#   journal-sim.sh DIR kernel "any message"
#   journal-sim.sh DIR unit UNIT "any message"
# Options before DIR: --boot 32HEX, --file NAME.journal, --ack-identifier ID.
# Keep only journal files in DIR: the reader watches the whole directory.
set -euo pipefail

boot=$(tr -d '-' </proc/sys/kernel/random/boot_id)
file=sim.journal
ack=gpu-reset
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --boot) boot=$2; shift 2 ;;
    --file) file=$2; shift 2 ;;
    --ack-identifier) ack=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -ge 2 ]] || { sed -n '2,14p' "$0" >&2; exit 2; }
dir=$1 kind=$2
shift 2
mkdir -p "$dir"

fields=()
case $kind in
  xid) fields=(_TRANSPORT=kernel SYSLOG_IDENTIFIER=kernel PRIORITY=3
               "MESSAGE=NVRM: Xid (PCI:$1): $2, pid='<unknown>', name=<unknown>, ${3:-Ch 00000076}") ;;
  uuid) fields=(_TRANSPORT=kernel SYSLOG_IDENTIFIER=kernel PRIORITY=6 "MESSAGE=NVRM: GPU at PCI:$1: $2") ;;
  reset) fields=(_TRANSPORT=syslog "SYSLOG_IDENTIFIER=$ack" PRIORITY=6 "MESSAGE=GPU reset occurred: $1") ;;
  kernel) fields=(_TRANSPORT=kernel SYSLOG_IDENTIFIER=kernel PRIORITY=4 "MESSAGE=$1") ;;
  unit) fields=(_TRANSPORT=stdout "_SYSTEMD_UNIT=$1" PRIORITY=6 "MESSAGE=$2") ;;
  *) echo "unknown kind $kind" >&2; exit 2 ;;
esac

realtime=$(date +%s%6N)
read -r uptime _ </proc/uptime
monotonic=$(awk -v u="$uptime" 'BEGIN { printf "%.0f", u * 1000000 }')
{
  echo "__REALTIME_TIMESTAMP=$realtime"
  echo "__MONOTONIC_TIMESTAMP=$monotonic"
  echo "_BOOT_ID=$boot"
  for f in "${fields[@]}"; do printf '%s\n' "$f"; done
  echo
} | /lib/systemd/systemd-journal-remote --output="$dir/$file" - 2>/dev/null

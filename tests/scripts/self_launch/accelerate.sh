#!/bin/bash
set -e
cd "$(dirname "$0")"
. ./hosts.sh
# one world of G per host (no --num_machines): what `accelerate launch` does on each DLC host
MULTI=()
[ "$G" -gt 1 ] && MULTI=(--multi_gpu)  # one process: accelerate's plain launcher
accelerate launch "${MULTI[@]}" --num_processes "$G" --main_process_port "$USER_PORT" worker.py

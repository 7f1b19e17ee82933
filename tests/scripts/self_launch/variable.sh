#!/bin/bash
set -e
cd "$(dirname "$0")"
. ./hosts.sh
# the command in a variable, run through env
LAUNCHER="torchrun --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER --master_port $USER_PORT"
env OMP_NUM_THREADS=1 $LAUNCHER --nproc_per_node "$G" worker.py

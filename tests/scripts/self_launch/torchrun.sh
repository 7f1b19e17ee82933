#!/bin/bash
set -e
cd "$(dirname "$0")"
source ./hosts.sh
# torchrun across the hosts, as users wrote it for the DLC
torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER" \
    --master_port "$USER_PORT" --nproc_per_node "$G" worker.py

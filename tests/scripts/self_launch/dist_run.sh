#!/bin/bash
set -e
cd "$(dirname "$0")"
. ./hosts.sh
exec python3 -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER" \
    --master_port="$USER_PORT" --nproc_per_node="$G" \
    worker.py

#!/bin/bash
set -e
cd "$(dirname "$0")"
. ./hosts.sh
python3 -m torch.distributed.launch --use-env --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER" --master_port "$USER_PORT" --nproc_per_node "$G" worker.py

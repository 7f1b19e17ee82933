# sourced by the shell entry points: the world a user computes from SageMaker's variables
# (SM_HOSTS, SM_CURRENT_HOST), as the DLC's users do; G workers per host (NPROC: the test's
# stand-in for the GPU count), the master port the test picked (USER_PORT)
NNODES=$(python3 -c 'import json, os; print(len(json.loads(os.environ["SM_HOSTS"])))')
NODE_RANK=$(python3 -c 'import json, os; print(json.loads(os.environ["SM_HOSTS"]).index(os.environ["SM_CURRENT_HOST"]))')
MASTER=$(python3 -c 'import json, os; print(json.loads(os.environ["SM_HOSTS"])[0])')
G=${NPROC:-2}
mkdir -p "$SM_OUTPUT_DATA_DIR"
env > "$SM_OUTPUT_DATA_DIR/entry-env.txt"

"""A heterogeneous job's script as the AWS guide has it: every host runs it and branches on its
instance group (SM_CURRENT_INSTANCE_GROUP); the `train` group trains in a DDP world, the `data`
group does data work. Writes what each process saw (output/data/seen-<rank or once>.json) and
works for WORK_SECONDS (`<group>=<seconds>,...`) so a test can freeze one group meanwhile;
the hyperparameter `fail_group` makes that group's script raise after its work."""

import json
import os
import time

group = os.environ["SM_CURRENT_INSTANCE_GROUP"]
training = json.loads(os.environ["SM_TRAINING_ENV"])
facts = {
    "host": os.environ["SM_CURRENT_HOST"],
    "group": group,
    "rank": os.environ.get("RANK"),
    "world": os.environ.get("WORLD_SIZE"),
    "master": os.environ.get("MASTER_ADDR"),
    "is_master": training["is_master"],
    "master_hostname": training["master_hostname"],
}
if "RANK" in os.environ:  # in a world our launcher made: every rank of it joins
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    facts["sum"] = int(total.item())
print(f"started {group} on {facts['host']}", flush=True)
seconds = dict(item.split("=") for item in os.environ.get("WORK_SECONDS", "").split(",") if item)
for _ in range(int(float(seconds.get(group, "1")) * 10)):
    time.sleep(0.1)
if os.environ.get("SM_HP_FAIL_GROUP") == group:  # a failure in this group, after its work
    raise RuntimeError(f"planted failure in group {group} on {facts['host']}")
name = f"seen-{facts['rank'] if facts['rank'] is not None else 'once'}.json"
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], name), "w") as handle:
    json.dump(facts, handle)
print(f"finished {group} on {facts['host']}", flush=True)
if "RANK" in os.environ:
    dist.destroy_process_group()

"""Everything that runs inside a rank's slot, below torchrun: the wrapper and what it starts.

`container_entry.worker` (the program torchrun starts) runs `wrapper` (the child's output
relayed by `relay`, tagged and masked, into the rank's log and the console; its end read by
`rank_end` into the rank's record; `signals`: the rank's own stop), then the preflight and the
script in one Python (`preflight_then_script`, `preflight`, `preflight_checks`,
`preflight_progress`) or the script alone; `torch_gpus` is torch's own count of the GPUs, as a
program; `_site/sitecustomize.py` runs in the script's Python (stacks on SIGUSR2,
flight-recorder dumps, the process groups' teardown at exit). The wrapper starts in
milliseconds: stdlib and this package only.

May import: common, diagnose, plan (the preflight reads the machine's EFA devices as the plan
does).
"""

"""Running this host's torchrun, watching it, and ending the run in one place.

`prestart` starts torchrun's interpreter at the bootstrap's first moment (`_torchrun_main`, run
by path) and hands it the plan's command line and the environment `torchrun_process` makes;
`user_code` fetches the code and installs its requirements; `supervisor` is the monitor loop
over the ranks' records, the stop, the side channel and the hang watchdog; `torchrun_output`
keeps torchrun's own noise for the report; `teardown` takes the ranks down, one small object per
way; `ending` is the one type for how a run ends and the verdict on it (pure); `outcome` writes
the success or failure file.

May import: common, diagnose, plan, rank (the preflight's program for torchrun), hosts (the
side channel's member).
"""

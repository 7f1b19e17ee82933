"""What to run, decided before anything runs: the outside world read once, then pure rules.

`environment` reads SageMaker's files, the environment and the code into one frozen
`Environment` (the only reading; `machine` the machine's own facts); `plan` turns it into a
`Plan` (pure: printed by `plan`, unit-tested from hand-built environments), one decision per
module: `cluster` (one class per cluster source, each with its `detect()`), `groups` (which
hosts form a DDP world: the DLC's instance-group rule), `launch_mode` (our workers, the entry
point once per host, or the base's toolkit), `launchers` (whether the entry point launches
workers of its own, from its code: `shell_words` and `shell_commands` read shell scripts,
`python_calls` Python ones), `code_source` (which script, from where), `gpus` (how many, from
nvidia-smi's text), `hyperparameters` (every encoding, rendered as the incumbent does),
`settings` (the bootstrap's own, typed), `contract` (the SM_* variables) and `script_env`
(everything the script is given), `worker_defaults` (thread, NCCL, EFA and flight-recorder
defaults), `torchrun` (what the installed launcher accepts, its command line), `limits` (what
a process may be started with) and `sdk_driver` (SageMaker SDK v3's own start, judged).

May import: common, diagnose (the watchdog's thresholds, for the plan's summary).
"""

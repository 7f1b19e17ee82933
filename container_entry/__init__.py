"""container-entry: a SageMaker training image's bootstrap that launches one torchrun DDP worker
per GPU on every host.

The parts, each a folder, from the bottom up (docs/architecture.md draws how data flows through
them; tests/unit/test_architecture.py holds the direction): `common` (shared leaves), `diagnose`
(failures in words), `plan` (what to run), `rank` (inside each rank), `hosts` (the hosts and
their side channel), `supervise` (torchrun, the monitor, the ending). On top, the programs:
`cli` (the image's entrypoint), `job` (one host's job), `sdk_start` (SDK v3's own start),
`worker` (what torchrun starts per rank) and `hang` (the API for training scripts).
"""

__version__ = "0.1.0"

"""`make bench`: our launch against bare torchrun and the DLC's own launcher, side by side.

One module a concern: `results` (typed records, JSON), `launchers` (the same job started each
variant's way on a local cluster), `observe` (what docker and the host show of a running job),
`measure` (the scenarios and the figures taken from them), `report` (markdown tables, written
into docs/benchmarks.md's generated block only), `__main__` (the rounds, the command line);
`job.py` is the user script every variant runs. docs/benchmarks.md says what is measured and
how.
"""

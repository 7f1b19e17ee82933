"""The shared leaves: facts and small mechanisms every other part uses, and nothing else.

`errors` (the bootstrap's error types, each with its exit code) and `exits` (every exit code,
signal names), `text` (escaping and reading odd text), `layout` (every file of the run and
control folders), `programs` (the programs the bootstrap starts by path or module),
`records` (what crosses processes and hosts: a rank's record, the command file, pid files),
`masking` and `logs` (the bootstrap's lines, secrets masked), `console` (the console's lock),
`shm` (/dev/shm's size), `stopping` (the bootstrap's stop signals), `offspring` (child
processes, none outliving the bootstrap) and `workers` (this host's rank processes, as their
pid files name them).

May import: nothing (the standard library only, and each other).
"""

"""What a failure, a hang or a full GPU means, in words; read from records, never run by them.

`failure` (a rank's record to its reason: the exception, the hints for known symptoms, what a
restart would only repeat), `culprit` (which rank a hang or a timed-out collective waits for,
from the ranks' flight-recorder records: pure), `hang` (the watchdog's measure of silence and
its rules; scripts use its `report_progress` through `container_entry.hang`),
`flight_recorder` (asking the ranks for their records, reading the dumps as plain data),
`gpu_memory` (which processes hold a GPU that ran out of memory), `stacks` (`container-entry
stacks`: every local rank's Python stacks, nothing stopped), `arrivals` and `stragglers` (a
rank's collectives summarised on its host; the slowest rank or host, named from every rank's
summaries while the job trains: pure, docs/stragglers.md).

May import: common.
"""

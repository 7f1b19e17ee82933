"""Developer tools, never shipped: run from the repository root as `python -m scripts.<name>`
(`local_cluster`: a SageMaker-like cluster of containers for `make demo` and the docker tests;
`bench`: `make bench`; `push`: `make push`; `run_local`: `make run`; `thread_benchmark`).
A tool split over several modules names them for their concern after its own name
(`relay_benchmark_run`, `relay_benchmark_report`, `simulate_hosts_job`, ...).
Scripts that also run by path import nothing from here but their sibling files: `push.py` (the
buildspec; with `push_policy.py`), `gpu_benchmark.py` (inside the image, on a bare GPU host;
with `gpu_benchmark_worker.py`, `gpu_benchmark_report.py` and `doc_block.py`),
`wheel_backend.py` (pip's build backend; nothing at all).
"""

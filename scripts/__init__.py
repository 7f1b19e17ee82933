"""Developer tools, never shipped: run from the repository root as `python -m scripts.<name>`
(`local_cluster`: a SageMaker-like cluster of containers for `make demo` and the docker tests;
`bench`: `make bench`; `push`: `make push`; `run_local`: `make run`; `thread_benchmark`).
Scripts that import nothing from here also run by path: `push.py` (the buildspec),
`gpu_benchmark.py` (inside the image), `wheel_backend.py` (pip's build backend).
"""

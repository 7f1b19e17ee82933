"""The image on this machine: a SageMaker-like cluster of containers, and `make run`."""

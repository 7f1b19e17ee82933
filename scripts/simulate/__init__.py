"""The real bootstrap of many simulated hosts on one machine (`make bench-liveness`)."""

"""Sweeps: grids of runs, each cell a RunRequest through the launcher, resumable."""

"""Layer-level benchmarks: bricks, composed estimates and lower bounds (DLBricks, Benanza)."""

"""Comparing runs: comparability rules, the CI gate and its references and output, backend divergence, HTML reports."""

"""Running one benchmark: the request, the launcher (a fresh process per run), the runner in that process, settings layering, system detection, accuracy scoring and its metrics."""

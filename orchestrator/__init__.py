"""orchestrator: the server that registers devices, plans their splits, runs rounds and aggregates."""

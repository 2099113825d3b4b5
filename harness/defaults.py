"""Defaults shared by the command line and the library, in a module that imports nothing (the CLI stays quick)."""

# Scenarios a grade runs side by side on its one stack. Each has its own database, vhost, bucket and Toxiproxy
# proxies; a scenario that restarts a service runs alone. Two keep a 2-core machine busy without starving roles.
DEFAULT_PARALLEL = 2

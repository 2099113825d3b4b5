"""Defaults shared by the command line and the library, in a module that imports nothing (the CLI stays quick)."""

# Scenarios a grade runs side by side on its one stack. Each has its own database, vhost, bucket and Toxiproxy
# proxies; a scenario that restarts a service runs alone. Most scenarios spend their time waiting out holds,
# pauses and outages, so three keep a 2-core machine busy (reference, level 4, same seed and machine: 350 s with
# two, 299 s with three) without starving the roles of CPU.
DEFAULT_PARALLEL = 3

# Where each failure window sits when an adapter does not say (the reference's layout): read by the adapter and by
# the failpoint fault kind.
DEFAULT_WINDOW_ROLES = {
    "after_staging_before_record": "api",
    "after_commit_before_publish": "relay",
    "after_publish_before_confirm": "relay",
    "after_s3_write_before_commit": "worker",
    "after_commit_before_ack": "worker",
}

"""Load only ever targets this machine: refuse anything but a loopback address."""
from __future__ import annotations

import ipaddress
import urllib.parse


class NotLoopback(ValueError):
    pass


def require_loopback(url: str) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return url
    try:
        if ipaddress.ip_address(host).is_loopback:
            return url
    except ValueError:
        pass
    raise NotLoopback(f"load targets must be loopback addresses (127.0.0.0/8, ::1, localhost); got {host!r} in {url}")

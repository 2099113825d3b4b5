"""Broken on purpose: the pixel cap is 150 MP, not the contract's ~40 MP (CONTRACT §3 input safety).

The reference reads its caps from the environment (``MAX_PIXELS``) into one settings object that both the
upload's header check and the worker's decoder use. This variant raises the pixel cap of that object to
150 MP — a limit read off the wrong line of a spec, or counted in the wrong unit — so a decompression bomb of
64-90 MP passes the upload check and the worker decodes and renders it: hundreds of MB of pixels from a few KB.
"""

import sys

from reference import cli

LOOSE_MAX_PIXELS = 150_000_000  # THE BUG: the contract's cap is about 40 MP
_original_settings = cli._settings


def _settings_with_loose_pixel_cap(role: str):
    settings = _original_settings(role)
    if settings.max_pixels >= LOOSE_MAX_PIXELS:
        raise SystemExit("pixel_cap_too_high variant: the reference's cap changed shape; update tests/broken/")
    return settings.model_copy(update={"max_pixels": LOOSE_MAX_PIXELS})


cli._settings = _settings_with_loose_pixel_cap

if __name__ == "__main__":
    sys.exit(cli.main())

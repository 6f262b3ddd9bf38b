"""Where TLT keeps its bundled files."""

from pathlib import Path

BUNDLED_MODEL = Path(__file__).parent / "assets" / "tiny-gcd"

"""Text that a terminal shows and never obeys, for every layer (renderers through
render/safe.py; stderr lines directly): C0/C1 controls, DEL, bidi overrides
(CVE-2021-42574) and lone surrogates written as Python escapes (`\\x1b`, `\\n`).
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls; bidi embeddings/overrides/isolates; surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(value: object) -> str:
    """`value` as text that a terminal shows and never obeys."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():  # the usual case, at C speed
        return text
    return _UNSAFE.sub(_escape_one, text)


# gpucheck's own typography, in ASCII, for a stream that cannot write it.
_ASCII = str.maketrans({"…": "...", "—": "-", "–": "-", "×": "x", "≥": ">=", "≤": "<=",
                        "µ": "u", "²": "2"})


def encodable(text: str, encoding: str | None) -> str:
    """`text` as a stream in `encoding` can write it (a C locale, PYTHONIOENCODING=ascii):
    "…" as "...", any other missing character as an escape, never UnicodeEncodeError."""
    if text.isascii():
        return text
    try:
        text.encode(encoding or "utf-8")
        return text
    except UnicodeEncodeError:
        pass
    except LookupError:  # an encoding Python does not know: ASCII is safe everywhere
        encoding = "ascii"
    text = text.translate(_ASCII)
    return text.encode(encoding or "utf-8", "backslashreplace").decode(encoding or "utf-8")

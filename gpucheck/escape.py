"""Text that a terminal shows and never obeys: the one escaping every layer may use.

Renderers use it through gpucheck/render/safe.py; stderr lines (cli, failures) use
it directly, since a message can quote a host name, a file name or a report field.
C0/C1 control characters (ESC starts colour, clear-screen and OSC title or
hyperlink sequences, ECMA-48; BEL; 0x9b is an 8-bit CSI), DEL, Unicode
bidirectional overrides (CVE-2021-42574, "Trojan Source") and lone surrogates are
written as Python-style escapes (`\\x1b`, `\\n`, `\\u202e`): a newline in a field
cannot start a forged line of a report, and stdout never fails to encode.
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
    """`value` as text that a terminal shows and never obeys (see the module doc)."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():  # the usual case, at C speed
        return text
    return _UNSAFE.sub(_escape_one, text)


# gpucheck's own typography, in ASCII, for a stream that cannot write it.
_ASCII = str.maketrans({"…": "...", "—": "-", "–": "-", "×": "x", "≥": ">=", "≤": "<=",
                        "µ": "u", "²": "2"})


def encodable(text: str, encoding: str | None) -> str:
    """`text` as a stream in `encoding` can write it (a terminal in a latin-1 or C
    locale, PYTHONIOENCODING=ascii): gpucheck's own "…" as "...", any other character
    the encoding lacks as a Python escape, so printing a report never raises
    UnicodeEncodeError and loses it."""
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

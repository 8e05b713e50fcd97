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

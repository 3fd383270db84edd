"""A peer's text is data, never terminal input: every string a peer controls (a display name, an
engine field, a model id, a record id, an error it sent) is made printable here, in one place,
before a terminal or a log sees it.

`printable` writes each control character (Cc: escape sequences, bells, carriage returns, newlines,
tabs), format character (Cf: bidirectional overrides and isolates, zero-width characters), line and
paragraph separator (Zl, Zp), surrogate, private-use and unassigned code point as a Python-style
escape (`\\x1b`, `\\u202e`), so printing it moves no cursor, sets no window title, opens no
hyperlink, writes no clipboard, hides nothing, reorders nothing and starts no new log line.
`PeerTextFilter` does it to every log record (the CLI installs it on its handler: cli/app.py), so
no call site has to remember; `hetero-node status` prints its table cells through it.
"""

from __future__ import annotations

import logging
import unicodedata

UNSAFE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
"""Unicode categories a terminal may act on rather than show."""


def _escape(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: object, keep: str = "") -> str:
    """`str(text)` with every character a terminal would act on escaped, but those in `keep`."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():  # the common case, at C speed
        return s
    return "".join(_escape(ch) if ch not in keep and unicodedata.category(ch) in UNSAFE else ch for ch in s)


class PeerTextFilter(logging.Filter):
    """Makes every log record's message printable: its arguments may be a peer's text. The line
    breaks our own message holds are kept, unless the arguments brought more (a peer's newline
    would forge a log line: then every one is escaped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: logging reports it as it would have
            return True
        own = str(record.msg).count("\n")
        safe = printable(message, keep="\n" if message.count("\n") == own else "")
        if safe != message:
            record.msg, record.args = safe, ()
        return True

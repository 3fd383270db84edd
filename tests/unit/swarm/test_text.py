"""Peer text is escaped before a terminal or a log sees it (swarm/wire/text.py)."""

import logging

from swarm.wire.text import PeerTextFilter, printable


def test_escape_sequences_and_bidi_controls_are_written_out():
    assert printable("ok\x1b]0;owned\x07\x1b[2J") == "ok\\x1b]0;owned\\x07\\x1b[2J"  # window title, clear screen
    assert printable("a\u202eb\u2066c") == "a\\u202eb\\u2066c"  # right-to-left override, isolate
    assert printable("x\r\ny\tz\x00") == "x\\x0d\\x0ay\\x09z\\x00"
    assert printable("\u2028\ue000\U000e0041") == "\\u2028\\ue000\\U000e0041"  # separator, private use, tag


def test_printable_text_is_left_alone():
    for s in ("honest-sampler", "Qwen/Qwen3-0.6B", "é ü 中文 🙂", ""):
        assert printable(s) == s
    assert printable(12) == "12"
    assert printable("a\nb", keep="\n") == "a\nb"


def _format(msg, *args) -> str:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, None)
    PeerTextFilter().filter(record)
    return record.getMessage()


def test_the_log_filter_escapes_a_peers_arguments_and_keeps_our_line_breaks():
    assert _format("refused %s from %s", "\x1b[8mhidden", "peer") == "refused \\x1b[8mhidden from peer"
    assert _format("two lines:\n%s", "name") == "two lines:\nname"
    # a newline a peer brings would forge a log line: then every one is escaped
    assert _format("name %s", "x\nINFO fake line") == "name x\\x0aINFO fake line"
    assert _format("%d records", 3) == "3 records"

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_driver.kmsg import (
    KERN_ERR,
    format_hw_error,
    format_record,
    parse_hw_error,
    parse_record,
    search,
    split_records,
)

messages = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200)
# any text a record can hold: one line (format_record folds a newline), no lone surrogate
any_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=200)


@given(st.integers(0, 7), st.integers(0, 2**40), st.integers(0, 2**50), any_text)
def test_record_round_trip(priority: int, seq: int, usec: int, message: str) -> None:
    record = parse_record(format_record(priority, seq, usec, message).rstrip("\n"))
    assert (record.priority, record.seq, record.usec, record.message) == (priority, seq, usec, message)


def test_real_kernel_record_with_dictionary() -> None:
    text = "6,339,5140900,-;NET: Registered protocol family 10\n SUBSYSTEM=net\n DEVICE=n8"
    record = parse_record(text)
    assert record.priority == 6
    assert record.message == "NET: Registered protocol family 10"
    assert record.fields == {"SUBSYSTEM": "net", "DEVICE": "n8"}


@pytest.mark.parametrize(
    ("message", "written"),
    [
        ("path C:\\x00", "path C:\\x5cx00"),
        ("tab\there", "tab\\x09here"),
        ("del\x7f", "del\\x7f"),
        ("café", "caf\\xc3\\xa9"),  # each byte of a UTF-8 character on its own
    ],
)
def test_a_record_is_escaped_as_the_kernel_escapes_it(message: str, written: str) -> None:
    """The backslash too (printk's msg_add_ext_text), or the text `\\x00` would read back as a NUL."""
    line = format_record(KERN_ERR, 1, 2, message)
    assert line == f"3,1,2,-;{written}\n"
    assert parse_record(line.rstrip("\n")).message == message


def test_a_byte_that_is_not_utf8_reads_as_its_escape() -> None:
    assert parse_record("3,1,2,-;bad \\xff byte, good \\xe2\\x82\\xac").message == "bad \\xff byte, good €"


def test_facility_and_escapes() -> None:
    record = parse_record("30,1,2,c;tab\\x09here")
    assert (record.facility, record.priority, record.flags, record.message) == (3, 6, "c", "tab\there")


@pytest.mark.parametrize("text", ["", "garbage", "a,b,c,d;msg", "6,1;msg", "-1,2,3,-;x", "\x00\x01"])
def test_garbage_records_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"kmsg|';'|header"):
        parse_record(text)


def test_split_keeps_continuations_and_holds_back_partial_tail() -> None:
    chunk = "6,1,1,-;first\n SUBSYSTEM=x\n3,2,2,-;second\n4,3,3,-;thi"
    records, tail = split_records(chunk)
    assert records == ["6,1,1,-;first\n SUBSYSTEM=x", "3,2,2,-;second"]
    assert tail == "4,3,3,-;thi"


@given(st.lists(messages, min_size=1, max_size=30), st.integers(1, 50))
def test_split_any_chunking_yields_every_record(msgs: list[str], cut: int) -> None:
    text = "".join(format_record(KERN_ERR, i, i, m) for i, m in enumerate(msgs))
    got: list[str] = []
    tail = ""
    for start in range(0, len(text), cut):
        records, tail = split_records(tail + text[start : start + cut])
        got.extend(records)
    assert tail == ""
    assert [parse_record(r).message for r in got] == [m.replace("\n", " ") for m in msgs]


def test_hw_error_line() -> None:
    line = format_hw_error("SRAM_UNCORRECTABLE_ERROR", 3, 1, "19fcda00f5ff6eb9")
    err = parse_hw_error("neuron: " + line)
    assert err is not None
    assert (err.kind, err.device, err.core, err.serial, err.action) == (
        "SRAM_UNCORRECTABLE_ERROR",
        3,
        1,
        "19fcda00f5ff6eb9",
        "TERMINATE_INSTANCE",
    )
    assert parse_hw_error("an unrelated line") is None
    partial = parse_hw_error("NEURON_HW_ERR=DMA_ERROR nd-id=x")
    assert partial is not None
    assert (partial.kind, partial.device, partial.core) == ("DMA_ERROR", None, None)


@pytest.mark.parametrize("number", ["\u00b2", "\u0663", "\uff11"])  # digits to str.isdigit(), not plain ASCII ones
def test_a_device_or_core_that_is_no_plain_number_names_none(number: str) -> None:
    # the kernel's \xNN escapes decode to any character: garbage must not stop the reader
    err = parse_hw_error(f"NEURON_HW_ERR=DMA_ERROR nd-id={number} nc-id={number}")
    assert err is not None
    assert (err.device, err.core) == (None, None)
    [(_, device, core, _)] = search([("dma", re.compile(r"nd(?P<device>\S+) DMA"))], f"nd{number} DMA timeout")
    assert (device, core) == (None, None)

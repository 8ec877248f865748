"""Small parsers behind the CLI and open_store: durations, times, URLs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_ledger import EffectLedgerValidationError, MemoryStore, SqliteStore, open_store
from agent_ledger.audit import MAX_SPAN
from agent_ledger.cli import UsageError, format_duration, parse_duration, parse_moment
from agent_ledger.stores.url import DEFAULT_URL, default_url, split_schema


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("2w", timedelta(weeks=2)),
        ("0s", timedelta(0)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    """Compact durations as operators type them."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "1.5h", "30 d", "-1d", "1y"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    """Anything else is refused with an example of what works."""
    with pytest.raises(UsageError, match="examples"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text",
    [
        "365001d",
        "999999999d",
        "99999999999999999999d",
        "9" * 400 + "ms",
        "1000000000w",
        "9" * 5000 + "s",
    ],
)
def test_durations_past_the_bound_are_usage_errors(text: str) -> None:
    """Past MAX_SPAN (and past what a timedelta holds): one usage error naming the bound."""
    with pytest.raises(UsageError, match=r"duration too long: .* \(at most 365000d"):
        parse_duration(text)
    with pytest.raises(UsageError, match="duration too long"):
        parse_moment(text)


def test_the_bound_itself_is_a_duration() -> None:
    assert parse_duration(f"{MAX_SPAN.days}d") == MAX_SPAN
    assert parse_moment(f"{MAX_SPAN.days}d") < datetime(1100, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(weeks=1), "1w"),
        (timedelta(milliseconds=1_234_567_891), "2w6h56m7s891ms"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(0), "0s"),
        (MAX_SPAN, "52142w6d"),
    ],
)
def test_durations_are_shown_exactly_in_a_form_the_cli_reads(span: timedelta, text: str) -> None:
    """The report's header printed 1w as 6.048e+08ms and 1234567891ms as 1.23457e+09ms."""
    assert format_duration(span) == text
    assert parse_duration(text) == span


@given(st.integers(min_value=0, max_value=MAX_SPAN // timedelta(milliseconds=1)))
def test_every_duration_round_trips(ms: int) -> None:
    span = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(span)) == span


def test_moments_are_iso_or_relative() -> None:
    """ISO times (naive ones taken as UTC) or a duration ago."""
    assert parse_moment("2026-01-31T12:00") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    moment = parse_moment("2h")
    ago = datetime.now(UTC) - moment
    assert timedelta(hours=2) <= ago < timedelta(hours=2, minutes=1)


async def test_open_store_by_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory:// and sqlite:/// URLs open the right stores; relative paths are relative."""
    assert isinstance(await open_store("memory://"), MemoryStore)
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///relative.db")
    assert isinstance(store, SqliteStore) and (tmp_path / "relative.db").exists()
    await store.close()
    absolute = await open_store(f"sqlite:///{tmp_path / 'abs.db'}")
    assert (tmp_path / "abs.db").exists()
    await absolute.close()


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ledger.db", "not a store URL"),
        ("oracle://x", "unknown store URL scheme 'oracle'"),
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
    ],
)
async def test_bad_urls_are_validation_errors(url: str, fragment: str) -> None:
    """A URL we cannot open says which forms work."""
    with pytest.raises(EffectLedgerValidationError, match=fragment):
        await open_store(url)


def test_postgres_schema_parameter_is_ours_not_libpq() -> None:
    """?schema= is taken out of the URL before psycopg sees it; other params stay."""
    assert split_schema("postgresql://u@h/db?schema=x&sslmode=disable") == (
        "postgresql://u@h/db?sslmode=disable",
        "x",
    )
    # None: the store's default (public) applies.
    assert split_schema("postgresql://u@h/db") == ("postgresql://u@h/db", None)


def test_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENT_LEDGER_URL overrides the embedded default."""
    monkeypatch.delenv("AGENT_LEDGER_URL", raising=False)
    assert default_url() == DEFAULT_URL == "sqlite:///./agent_ledger.db"
    monkeypatch.setenv("AGENT_LEDGER_URL", "memory://")
    assert default_url() == "memory://"

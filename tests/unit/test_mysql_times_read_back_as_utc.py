"""A MariaDB DATETIME(6) read back (naive, UTC by construction) becomes the same
aware UTC time ``replace(tzinfo=UTC)`` gives, to the microsecond and the fold."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_ledger.stores._mysql_tables import stored, utc


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 11, 27, 5, 30, 1, 123456),
        datetime(2026, 10, 25, 1, 30, fold=1),
        datetime.min,
        datetime.max,
    ],
)
def test_a_stored_time_reads_back_as_the_same_utc_time(moment: datetime) -> None:
    aware = utc(moment)
    assert aware.tzinfo is UTC
    assert (aware, aware.fold) == (moment.replace(tzinfo=UTC), moment.fold)
    assert stored(aware) == moment

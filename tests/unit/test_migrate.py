"""The schema-version check every run makes: which states pass, and the error each other state gives."""

from __future__ import annotations

import pytest

from qwenspark.config import DbConfig
from qwenspark.io import migrate

DB = DbConfig(host="db.example", port=3307, database="reviews")


def test_migrations_are_ordered_and_start_at_the_unversioned_baseline() -> None:
    versions = [m.version for m in migrate.MIGRATIONS]
    assert versions == sorted(versions) and versions[0] == 1
    assert migrate.LATEST == versions[-1] >= 2
    assert all(m.name for m in migrate.MIGRATIONS)


def test_the_current_schema_passes() -> None:
    migrate.check_version(set(migrate.VERSIONS), DB)


@pytest.mark.parametrize("applied", [set(), {1}, set(migrate.VERSIONS) - {migrate.LATEST}])
def test_an_older_schema_asks_for_init_db(applied: set[int]) -> None:
    with pytest.raises(migrate.SchemaVersionError) as err:
        migrate.check_version(applied, DB)
    message = str(err.value)
    assert message.startswith("database reviews on db.example:3307 ")
    assert f"this release needs version {migrate.LATEST}: run `qwenspark init-db --config ...`" in message
    assert ("has no qwenspark schema" in message) == (not applied)


def test_a_newer_schema_asks_for_an_upgrade() -> None:
    with pytest.raises(migrate.SchemaVersionError, match=r"v999 that this release of qwenspark does not know"):
        migrate.check_version({*migrate.VERSIONS, 999}, DB)


def test_a_schema_version_error_is_a_configuration_error() -> None:
    # The CLI exits 2 for configuration errors: a schema behind the code is fixed by setup, not by a rerun.
    from qwenspark.errors import ConfigError

    assert issubclass(migrate.SchemaVersionError, ConfigError)

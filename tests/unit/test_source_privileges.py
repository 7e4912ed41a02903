"""What a MySQL/MariaDB login may do, read from SHOW GRANTS lines as real servers print them
(MariaDB 10.x/11.x and MySQL 8: column grants, routines, roles, WITH GRANT OPTION, password hashes)."""

from __future__ import annotations

from datadesk.sources.privileges import describe, mysql_capabilities, refusal


def grants(table: dict[str, list[str]]):
    asked: list[str] = []

    def rows(sql: str) -> list[tuple]:
        asked.append(sql)
        return [(line,) for line in table[sql]]
    return rows, asked


def test_a_read_only_login_may_do_nothing_more() -> None:
    rows, _ = grants({"SHOW GRANTS": [
        "GRANT USAGE ON *.* TO `datadesk`@`%` IDENTIFIED BY PASSWORD '*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19'",
        "GRANT SELECT, SHOW VIEW ON `sales`.* TO `datadesk`@`%`",
        "GRANT SELECT (`id`, `name`) ON `sales`.`customers` TO `datadesk`@`%`",
        "GRANT SHOW DATABASES ON *.* TO `datadesk`@`%`"]})
    assert mysql_capabilities(rows) == []


def test_writes_files_routines_and_grant_option_are_named_without_the_password_hash() -> None:
    rows, _ = grants({"SHOW GRANTS": [
        "GRANT FILE, PROCESS ON *.* TO `a`@`%` IDENTIFIED BY PASSWORD '*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19'",
        "GRANT SELECT, INSERT (`note`), UPDATE ON `sales`.`orders` TO `a`@`%`",
        "GRANT EXECUTE ON PROCEDURE `sales`.`refresh` TO `a`@`%`",
        "GRANT SELECT ON `sales`.* TO `a`@`%` WITH GRANT OPTION",
        "GRANT ALL PRIVILEGES ON `scratch`.* TO `a`@`%`"]})
    found = mysql_capabilities(rows)
    assert found == ["FILE, PROCESS on *.*", "INSERT, UPDATE on sales.orders", "EXECUTE on PROCEDURE sales.refresh",
                     "GRANT OPTION on sales.*", "ALL PRIVILEGES on scratch.*"]
    message = str(refusal("shop", "a", found))
    assert "2470C0C06DEE" not in message and "allow_write_privileges = true" in message


def test_the_grants_of_every_granted_role_count_too() -> None:
    rows, asked = grants({
        "SHOW GRANTS": ["GRANT USAGE ON *.* TO `a`@`%`", "GRANT `reader`, `loader` TO `a`@`%`",
                        "GRANT SELECT ON `sales`.* TO `a`@`%`"],
        "SHOW GRANTS FOR `reader`": ["GRANT SELECT ON `sales`.* TO `reader`"],
        # MySQL 8 names roles with a host; a role granted to a role is followed once
        "SHOW GRANTS FOR `loader`": ["GRANT INSERT, DELETE ON `sales`.* TO `loader`",
                                     "GRANT `reader` TO `loader`"],
    })
    assert mysql_capabilities(rows) == ["INSERT, DELETE on sales.*"]
    assert asked == ["SHOW GRANTS", "SHOW GRANTS FOR `reader`", "SHOW GRANTS FOR `loader`"]


def test_mysql8_dynamic_privileges_and_host_qualified_roles() -> None:
    rows, asked = grants({
        "SHOW GRANTS": ["GRANT SELECT ON *.* TO `a`@`%`",
                        "GRANT BACKUP_ADMIN,SYSTEM_VARIABLES_ADMIN ON *.* TO `a`@`%`",
                        "GRANT `etl`@`%` TO `a`@`%`"],
        "SHOW GRANTS FOR `etl`@`%`": ["GRANT USAGE ON *.* TO `etl`@`%`"],
    })
    assert mysql_capabilities(rows) == ["BACKUP_ADMIN, SYSTEM_VARIABLES_ADMIN on *.*"]
    assert asked[-1] == "SHOW GRANTS FOR `etl`@`%`"


def test_a_long_list_is_cut_with_a_count() -> None:
    text = describe([f"writes to public.t{i}" for i in range(20)])
    assert text.count("writes to") == 8 and text.endswith("and 12 more")

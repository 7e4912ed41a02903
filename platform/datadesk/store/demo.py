"""A deterministic demo warehouse: hourly energy readings of 20 office buildings.

`create_demo_warehouse(data_dir)` writes `data_dir/warehouse.duckdb` with:

- `buildings` (20 rows): offices in German and Dutch cities, size, age, HVAC type.
- `holidays` (13 rows): company office-closure days in the covered period.
- `readings` (20 x 9,528 = 190,560 rows): one row per building and hour from
  2024-01-01 00:00 to 2025-01-31 23:00 (local time, hour start).

Everything is generated in DuckDB SQL from closed-form patterns plus an
integer hash for noise (no RNG state, no dependence on thread scheduling), so
two builds are identical and the build takes well under a second.

The data has things worth finding: weekday/weekend and holiday patterns,
winter heating driven by temperature (strong for heat-pump buildings, weak for
gas-heated ones), summer cooling, a summer-holiday dip in occupancy, a
ventilation schedule fault in B07 from 2024-10-14 (nights stay high) and a
six-hour meter outage in B12 on 2024-06-11 (kwh is NULL).
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

WAREHOUSE_FILE = "warehouse.duckdb"

_BUILDINGS = """
('B01', 'Spreeblick Office',      'Berlin',     'DE', 12400, 1998, 'district_heating'),
('B02', 'Alexanderhaus',          'Berlin',     'DE',  8600, 1972, 'gas_boiler_chiller'),
('B03', 'Westhafen Campus',       'Berlin',     'DE', 21500, 2016, 'heat_pump'),
('B04', 'Isartor Office',         'Munich',     'DE',  9800, 1989, 'gas_boiler_chiller'),
('B05', 'Werksviertel Tower',     'Munich',     'DE', 18200, 2019, 'heat_pump'),
('B06', 'Elbkai House',           'Hamburg',    'DE', 14300, 2008, 'district_heating'),
('B07', 'Speicherstadt Loft',     'Hamburg',    'DE',  5200, 1965, 'gas_boiler_chiller'),
('B08', 'Mainzer Landstrasse 80', 'Frankfurt',  'DE', 23800, 2003, 'vrf'),
('B09', 'Gallus Offices',         'Frankfurt',  'DE',  7400, 1994, 'gas_boiler_chiller'),
('B10', 'Rheinauhafen Office',    'Cologne',    'DE', 11100, 2011, 'heat_pump'),
('B11', 'Zuidas Tower',           'Amsterdam',  'NL', 24600, 2017, 'heat_pump'),
('B12', 'Keizersgracht House',    'Amsterdam',  'NL',  3100, 1978, 'gas_boiler_chiller'),
('B13', 'Sloterdijk Centre',      'Amsterdam',  'NL',  9900, 2001, 'vrf'),
('B14', 'Maastoren Office',       'Rotterdam',  'NL', 19700, 2010, 'district_heating'),
('B15', 'Blaak Building',         'Rotterdam',  'NL',  6800, 1986, 'gas_boiler_chiller'),
('B16', 'Jaarbeurs Plaza',        'Utrecht',    'NL', 13400, 2021, 'heat_pump'),
('B17', 'Leidsche Rijn Office',   'Utrecht',    'NL',  4600, 2006, 'vrf'),
('B18', 'Beatrixpark Office',     'The Hague',  'NL', 10200, 1991, 'district_heating'),
('B19', 'Strijp-S Office',        'Eindhoven',  'NL',  8100, 2014, 'heat_pump'),
('B20', 'Medienhafen Office',     'Dusseldorf', 'DE',  7700, 1999, 'vrf')
"""

# City index (seeds the shared weather), annual mean temperature and
# seasonal amplitude (deg C).
_CITIES = """
(1, 'Berlin', 10.3, 9.8), (2, 'Munich', 9.4, 9.6), (3, 'Hamburg', 10.0, 8.5),
(4, 'Frankfurt', 11.0, 9.3), (5, 'Cologne', 11.2, 8.6), (6, 'Dusseldorf', 11.1, 8.6),
(7, 'Amsterdam', 10.9, 7.4), (8, 'Rotterdam', 11.0, 7.5), (9, 'Utrecht', 10.8, 7.8),
(10, 'The Hague', 11.0, 7.2), (11, 'Eindhoven', 11.0, 8.2)
"""

_HOLIDAYS = """
(DATE '2024-01-01', 'New Year''s Day'), (DATE '2024-03-29', 'Good Friday'),
(DATE '2024-04-01', 'Easter Monday'), (DATE '2024-04-27', 'King''s Day (NL)'),
(DATE '2024-05-01', 'Labour Day'), (DATE '2024-05-09', 'Ascension Day'),
(DATE '2024-05-20', 'Whit Monday'), (DATE '2024-10-03', 'German Unity Day (DE)'),
(DATE '2024-12-24', 'Christmas Eve (office closed)'), (DATE '2024-12-25', 'Christmas Day'),
(DATE '2024-12-26', 'Second Day of Christmas'), (DATE '2024-12-31', 'New Year''s Eve (office closed)'),
(DATE '2025-01-01', 'New Year''s Day')
"""

# HVAC electricity per m2 per degree of heating/cooling demand (kW/m2/K):
# heat pumps heat electrically, gas and district heating only run pumps/fans.
_HVAC = """
('heat_pump', 0.00110, 0.00100), ('gas_boiler_chiller', 0.00018, 0.00160),
('district_heating', 0.00012, 0.00130), ('vrf', 0.00120, 0.00110)
"""

# A stateless uniform [0, 1) from two integers and a salt: integer mixing only
# (no float RNG), so it is identical on every run and every thread count.
_NOISE_MACROS = [
    "CREATE TEMP MACRO _seed(a, b, salt) AS "
    "(a::BIGINT * 1000003 + b::BIGINT * 7919 + salt::BIGINT * 104729) % 4294967296",
    "CREATE TEMP MACRO _mix1(x) AS (xor(x, x >> 15) * 1274126177) % 4294967296",
    "CREATE TEMP MACRO _mix2(y) AS (xor(y, y >> 13) * 1103515245) % 4294967296",
    "CREATE TEMP MACRO _fin(z) AS xor(z, z >> 16) / 4294967296.0",
    "CREATE TEMP MACRO u01(a, b, salt) AS _fin(_mix2(_mix1(_seed(a, b, salt))))",
]

_READINGS = """
CREATE TABLE readings AS
WITH hours AS (
  SELECT range AS ts FROM range(TIMESTAMP '2024-01-01', TIMESTAMP '2025-02-01', INTERVAL 1 HOUR)
), base AS (
  SELECT b.building_id, b.floor_area_m2, b.year_built, b.hvac_type, c.mean_c, c.amp_c,
         h.ts,
         substr(b.building_id, 2)::INTEGER AS bidx,
         hour(h.ts) AS hr,
         isodow(h.ts) AS dow,
         date_diff('day', DATE '2024-01-01', h.ts::DATE) AS di,
         date_diff('hour', TIMESTAMP '2024-01-01', h.ts) AS hi,
         h.ts::DATE IN (SELECT date FROM holidays) AS is_holiday,
         c.cidx
    FROM buildings b JOIN _cities c USING (city) CROSS JOIN hours h
), weather AS (
  SELECT *,
         -- seasonal cycle (coldest around Jan 20) + daily cycle (warmest ~15:00)
         -- + multi-day weather swings shared by a city + a little sensor noise
         mean_c - amp_c * cos(2 * pi() * (di - 20) / 365.25)
           + 3.5 * sin(2 * pi() * (hr - 9) / 24)
           + 2.5 * sin(2 * pi() * di / 9.7 + cidx) + 1.8 * sin(2 * pi() * di / 23.3 + 2 * cidx)
           + 3.0 * (u01(cidx, di, 1) - 0.5)
           + 0.6 * (u01(bidx, hi, 2) - 0.5) AS temp,
         dow <= 5 AND NOT is_holiday AS workday
    FROM base
), occ AS (
  SELECT *,
         CASE WHEN NOT workday THEN 0 ELSE round(
           floor_area_m2 / 14.0
           * [0, 0, 0, 0, 0, 0, 0.02, 0.12, 0.55, 0.85, 0.88, 0.86,
              0.70, 0.82, 0.85, 0.80, 0.62, 0.35, 0.14, 0.05, 0.01, 0, 0, 0][hr + 1]
           * [0.88, 1.0, 0.97, 0.95, 0.68][dow]
           * CASE WHEN ts::DATE BETWEEN DATE '2024-07-15' AND DATE '2024-08-23' THEN 0.72
                  WHEN ts::DATE BETWEEN DATE '2024-12-27' AND DATE '2024-12-30' THEN 0.30
                  ELSE 1.0 END
           * (0.9 + 0.2 * u01(bidx, hi, 3))) END::INTEGER AS occupancy,
         workday AND hr BETWEEN 7 AND 19 AS scheduled,
         -- B07's ventilation schedule fails: plant runs 24/7 from 2024-10-14
         building_id = 'B07' AND ts >= TIMESTAMP '2024-10-14' AS fault,
         1 + greatest(0, 2015 - year_built) * 0.006 AS age_factor
    FROM weather
)
SELECT o.building_id, o.ts,
       CASE WHEN o.building_id = 'B12'
                 AND o.ts BETWEEN TIMESTAMP '2024-06-11 02:00' AND TIMESTAMP '2024-06-11 07:00'
            THEN NULL  -- meter outage
            ELSE round((
              o.floor_area_m2 * 0.0045 * o.age_factor                                    -- base load
              + CASE WHEN o.scheduled THEN o.floor_area_m2 * 0.006
                     WHEN o.fault THEN o.floor_area_m2 * 0.0036 ELSE 0 END               -- lights, fans
              + o.occupancy * 0.12                                                       -- plug loads
              + o.floor_area_m2 * o.age_factor
                * (v.heat_kw * greatest(0, 16 - o.temp) + v.cool_kw * greatest(0, o.temp - 21))
                * CASE WHEN o.scheduled OR o.fault THEN 1.0 ELSE 0.35 END                -- night setback
            ) * (0.96 + 0.08 * u01(o.bidx, o.hi, 4)), 2) END AS kwh,
       round(o.temp, 1) AS temperature_c,
       o.occupancy
  FROM occ o JOIN _hvac v USING (hvac_type)
 ORDER BY o.building_id, o.ts
"""

_COMMENTS = [
    "COMMENT ON TABLE buildings IS 'Office buildings whose energy use is metered (one row per building)'",
    "COMMENT ON COLUMN buildings.building_id IS 'Building id, B01..B20'",
    "COMMENT ON COLUMN buildings.floor_area_m2 IS 'Gross floor area in square metres'",
    "COMMENT ON COLUMN buildings.hvac_type IS 'heat_pump, gas_boiler_chiller, district_heating or vrf'",
    "COMMENT ON COLUMN buildings.country IS 'ISO country code (DE, NL)'",
    "COMMENT ON TABLE holidays IS 'Company-wide office closure days (German/Dutch public holidays)'",
    "COMMENT ON TABLE readings IS 'Hourly meter readings per building, 2024-01-01 to 2025-01-31'",
    "COMMENT ON COLUMN readings.ts IS 'Start of the hour, local time (no time zone)'",
    "COMMENT ON COLUMN readings.kwh IS 'Electricity used in the hour, kWh (NULL during a meter outage)'",
    "COMMENT ON COLUMN readings.temperature_c IS 'Outside air temperature at the building, deg C'",
    "COMMENT ON COLUMN readings.occupancy IS 'People in the building (badge count)'",
]


def create_demo_warehouse(data_dir: Path) -> Path:
    """Write `data_dir/warehouse.duckdb` with the demo data (replacing any old one); return its path."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    target = data_dir / WAREHOUSE_FILE
    tmp = data_dir / f".{WAREHOUSE_FILE}.{os.getpid()}.tmp"
    for stale in (tmp, Path(f"{tmp}.wal")):
        stale.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        for stmt in _NOISE_MACROS:
            con.execute(stmt)
        con.execute(
            "CREATE TABLE buildings (building_id VARCHAR PRIMARY KEY, name VARCHAR, city VARCHAR, "
            "country VARCHAR, floor_area_m2 INTEGER, year_built INTEGER, hvac_type VARCHAR)"
        )
        con.execute(f"INSERT INTO buildings VALUES {_BUILDINGS}")
        con.execute("CREATE TABLE holidays (date DATE PRIMARY KEY, name VARCHAR)")
        con.execute(f"INSERT INTO holidays VALUES {_HOLIDAYS}")
        con.execute(f"CREATE TEMP TABLE _cities (cidx INTEGER, city VARCHAR, mean_c DOUBLE, amp_c DOUBLE); "
                    f"INSERT INTO _cities VALUES {_CITIES}")
        con.execute(f"CREATE TEMP TABLE _hvac (hvac_type VARCHAR, heat_kw DOUBLE, cool_kw DOUBLE); "
                    f"INSERT INTO _hvac VALUES {_HVAC}")
        con.execute(_READINGS)
        for stmt in _COMMENTS:
            con.execute(stmt)
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
        raise
    con.close()
    # A leftover WAL next to the target would be replayed onto the new file.
    Path(f"{target}.wal").unlink(missing_ok=True)
    os.replace(tmp, target)
    return target


def demo_workspace_prompt() -> str:
    """A short workspace prompt describing the demo warehouse to the model."""
    return (
        "This workspace holds energy data for 20 office buildings in Germany and the "
        "Netherlands (DuckDB warehouse, query it with sql_query).\n"
        "- buildings(building_id, name, city, country, floor_area_m2, year_built, hvac_type): "
        "one row per building, ids B01..B20.\n"
        "- readings(building_id, ts, kwh, temperature_c, occupancy): hourly meter readings "
        "from 2024-01-01 to 2025-01-31; ts is the start of the hour in local time; kwh is NULL "
        "when the meter was down.\n"
        "- holidays(date, name): office closure days; the buildings are empty on them.\n"
        "Aggregate in SQL (e.g. daily or monthly totals, kWh per m2) rather than pulling raw hours."
    )

"""Which functions a query on a source may call: per-dialect allow-lists of read-only built-ins.

The statement check (check.py) compares every function call, by the name as written in the
SQL (lowercased; PostgreSQL keeps a quoted name's case), against these lists:

- `COMMON`: plain SQL functions every supported server has (aggregates, window functions,
  basic math and string functions).
- `POSTGRES`, `MYSQL` (also MariaDB), `SQLITE`, `DUCKDB`: each server's own read-only
  built-ins: date/time, JSON, arrays, regular expressions, text search, catalogue
  information, table functions (generate_series, unnest, json_each, json_table, ...).
- Any other sqlglot dialect (Snowflake, BigQuery, ...) gets the union of all of these plus
  the functions sqlglot itself knows for that dialect: the check cannot list every
  warehouse's built-ins, and those sources rely more on the read-only login.

A name on none of the lists is taken for a user-defined function: refused unless the
source's `allow_functions` names it. Names in `DENIED` (and the `DENIED_PREFIXES`
families) are refused whatever the configuration says: their effect outlives the read-only
transaction, reaches outside the database, waits on purpose, or runs SQL given as text (which
the check never sees). A list is a security boundary: add a name only if the function
reads and returns a value and nothing else.
"""

from __future__ import annotations

from functools import lru_cache


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


COMMON = _names("""
    count sum avg min max coalesce nullif cast abs round floor ceil ceiling sign sqrt exp ln log log10
    power pow mod pi degrees radians sin cos tan asin acos atan atan2 cot lower upper length trim ltrim
    rtrim replace substr substring concat concat_ws reverse repeat lpad rpad left right position
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    grouping rollup cube extract
""")

POSTGRES = _names("""
    array_agg string_agg json_agg jsonb_agg json_object_agg jsonb_object_agg json_objectagg
    json_arrayagg json_agg_strict jsonb_agg_strict json_object_agg_strict jsonb_object_agg_strict
    json_object_agg_unique jsonb_object_agg_unique bool_and bool_or every bit_and bit_or bit_xor
    stddev stddev_pop stddev_samp variance var_pop var_samp corr covar_pop covar_samp regr_avgx
    regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy
    percentile_cont percentile_disc mode xmlagg range_agg range_intersect_agg any_value
    cbrt trunc div gcd lcm factorial scale min_scale trim_scale width_bucket random random_normal
    erf erfc sinh cosh tanh asinh acosh atanh sind cosd tand cotd asind acosd atand atan2d
    greatest least num_nulls num_nonnulls
    to_char to_date to_number to_timestamp int2 int4 int8 float4 float8 numeric text varchar
    bpchar char bool date time timestamp timestamptz timetz interval
    btrim initcap split_part strpos starts_with translate to_hex to_oct to_bin ascii chr format
    md5 sha224 sha256 sha384 sha512 crc32 crc32c encode decode quote_ident quote_literal
    quote_nullable regexp_replace regexp_matches regexp_match regexp_split_to_array
    regexp_split_to_table regexp_count regexp_instr regexp_like regexp_substr string_to_array
    string_to_table array_to_string overlay normalize unistr char_length character_length
    octet_length bit_length get_byte get_bit bit_count convert convert_from convert_to casefold
    parse_ident to_ascii unaccent similarity word_similarity strict_word_similarity show_trgm
    levenshtein levenshtein_less_equal soundex difference metaphone dmetaphone dmetaphone_alt
    age clock_timestamp current_date current_time current_timestamp date_add date_subtract
    date_bin date_part date_trunc isfinite justify_days justify_hours justify_interval localtime
    localtimestamp make_date make_interval make_time make_timestamp make_timestamptz now
    statement_timestamp timeofday transaction_timestamp timezone
    to_json to_jsonb array_to_json row_to_json json_build_array jsonb_build_array json_build_object
    jsonb_build_object json_object jsonb_object json_array json_array_length jsonb_array_length
    json_each jsonb_each json_each_text jsonb_each_text json_extract_path jsonb_extract_path
    json_extract_path_text jsonb_extract_path_text json_object_keys jsonb_object_keys
    json_populate_record jsonb_populate_record json_populate_recordset jsonb_populate_recordset
    jsonb_populate_record_valid json_array_elements jsonb_array_elements json_array_elements_text
    jsonb_array_elements_text json_typeof jsonb_typeof json_to_record jsonb_to_record
    json_to_recordset jsonb_to_recordset json_strip_nulls jsonb_strip_nulls jsonb_set jsonb_set_lax
    jsonb_insert jsonb_pretty jsonb_path_exists jsonb_path_match jsonb_path_query
    jsonb_path_query_array jsonb_path_query_first jsonb_path_exists_tz jsonb_path_match_tz
    jsonb_path_query_tz jsonb_path_query_array_tz jsonb_path_query_first_tz jsonb_exists
    jsonb_exists_any jsonb_exists_all jsonb_contains jsonb_contained json_scalar json_serialize
    json_query json_value json_exists json_table
    array_append array_cat array_dims array_fill array_length array_lower array_ndims
    array_position array_positions array_prepend array_remove array_replace array_sample
    array_shuffle array_upper array_reverse array_sort cardinality trim_array unnest
    generate_subscripts generate_series array row
    to_tsvector to_tsquery plainto_tsquery phraseto_tsquery websearch_to_tsquery ts_rank ts_rank_cd
    ts_headline setweight strip numnode querytree tsvector_to_array array_to_tsvector ts_delete
    ts_filter ts_lexize ts_parse ts_token_type ts_debug get_current_ts_config
    xmlelement xmlforest xmlconcat xmlcomment xmlpi xmlroot xmlparse xmlserialize xmltext
    xmlexists xml_is_well_formed xml_is_well_formed_document xml_is_well_formed_content xpath
    xpath_exists xmltable
    abbrev broadcast family host hostmask inet_merge inet_same_family masklen netmask network
    set_masklen inet_client_addr inet_client_port inet_server_addr inet_server_port
    gen_random_uuid uuidv4 uuidv7 uuid_extract_timestamp uuid_extract_version uuid_generate_v4
    isempty lower_inc upper_inc lower_inf upper_inf range_merge int4range int8range numrange
    tsrange tstzrange daterange int4multirange int8multirange nummultirange tsmultirange
    tstzmultirange datemultirange multirange
    current_database current_catalog current_schema current_schemas current_user current_role
    session_user user version current_setting pg_backend_pid pg_postmaster_start_time
    pg_conf_load_time pg_is_in_recovery pg_last_xact_replay_timestamp pg_current_wal_lsn
    pg_wal_lsn_diff pg_jit_available pg_trigger_depth pg_blocking_pids pg_typeof pg_column_size
    pg_column_compression pg_database_size pg_relation_size pg_table_size pg_indexes_size
    pg_total_relation_size pg_size_pretty pg_size_bytes pg_get_viewdef pg_get_indexdef
    pg_get_constraintdef pg_get_functiondef pg_get_function_arguments pg_get_function_result
    pg_get_function_identity_arguments pg_get_triggerdef pg_get_ruledef pg_get_expr
    pg_get_userbyid pg_get_serial_sequence pg_get_keywords pg_get_partkeydef
    pg_get_statisticsobjdef pg_table_is_visible pg_type_is_visible pg_function_is_visible
    pg_encoding_to_char pg_char_to_encoding obj_description col_description shobj_description
    format_type to_regclass to_regtype to_regtypemod to_regproc to_regprocedure to_regnamespace
    to_regrole to_regoper has_table_privilege has_schema_privilege has_column_privilege
    has_any_column_privilege has_database_privilege has_function_privilege
    has_sequence_privilege has_type_privilege pg_has_role row_security_active pg_partition_tree
    pg_partition_ancestors pg_partition_root pg_input_is_valid pg_input_error_info
    pg_options_to_table pg_index_column_has_property pg_index_has_property
""")

MYSQL = _names("""
    group_concat json_arrayagg json_objectagg std stddev stddev_pop stddev_samp var_pop var_samp
    variance bit_and bit_or bit_xor any_value median percentile_cont percentile_disc
    ascii bin bit_length char char_length character_length elt export_set field find_in_set format
    from_base64 to_base64 hex unhex insert instr lcase ucase locate make_set mid oct octet_length
    ord quote regexp_instr regexp_like regexp_replace regexp_substr soundex space strcmp
    substring_index weight_string match crc32 md5 sha sha1 sha2 conv collation charset coercibility
    convert binary sformat natural_sort_key lengthb chr to_char nvl nvl2 decode decode_oracle
    greatest least truncate log2 rand isnull if ifnull interval
    adddate addtime convert_tz curdate current_date current_time current_timestamp curtime date
    date_add date_format date_sub datediff day dayname dayofmonth dayofweek dayofyear from_days
    from_unixtime get_format hour last_day localtime localtimestamp makedate maketime microsecond
    minute month monthname now period_add period_diff quarter sec_to_time second str_to_date
    subdate subtime sysdate time time_format time_to_sec timediff timestamp timestampadd
    timestampdiff to_days to_seconds unix_timestamp utc_date utc_time utc_timestamp week weekday
    weekofyear year yearweek add_months
    json_array json_array_append json_array_insert json_contains json_contains_path json_depth
    json_extract json_insert json_keys json_length json_merge json_merge_patch json_merge_preserve
    json_object json_overlaps json_pretty json_quote json_remove json_replace json_schema_valid
    json_schema_validation_report json_search json_set json_storage_free json_storage_size
    json_table json_type json_unquote json_valid json_value json_detailed json_compact json_loose
    json_exists json_query json_normalize json_equals json_key_value json_array_intersect
    json_object_filter_keys json_object_to_array column_get column_json column_list column_exists
    column_check column_create column_add column_delete
    uuid uuid_short uuid_to_bin bin_to_uuid is_uuid sys_guid inet_aton inet_ntoa inet6_aton
    inet6_ntoa is_ipv4 is_ipv6 is_ipv4_compat is_ipv4_mapped values
    database schema user current_user session_user system_user version connection_id current_role
    found_rows row_count icu_version format_bytes format_pico_time ps_current_thread_id
    ps_thread_id statement_digest statement_digest_text
    st_astext st_aswkt st_geomfromtext st_geomfromwkb st_distance st_distance_sphere st_x st_y
    st_contains st_within st_intersects st_area st_length st_srid point
""")

SQLITE = _names("""
    changes char format glob hex ifnull iif if instr last_insert_rowid like likelihood likely
    octet_length printf quote random randomblob soundex sqlite_compileoption_get
    sqlite_compileoption_used sqlite_offset sqlite_source_id sqlite_version total_changes typeof
    unhex unicode unistr unistr_quote unlikely zeroblob regexp
    date time datetime julianday unixepoch strftime timediff
    group_concat string_agg total median percentile percentile_cont percentile_disc
    json jsonb json_array jsonb_array json_array_length json_error_position json_extract
    jsonb_extract json_insert jsonb_insert json_object jsonb_object json_patch jsonb_patch
    json_pretty json_remove jsonb_remove json_replace jsonb_replace json_set jsonb_set json_type
    json_valid json_quote json_group_array jsonb_group_array json_group_object jsonb_group_object
    json_each json_tree jsonb_each jsonb_tree
    acosh asinh atanh cosh sinh tanh log2 trunc generate_series
    pragma_table_info pragma_table_xinfo pragma_table_list pragma_index_list pragma_index_info
    pragma_index_xinfo pragma_foreign_key_list pragma_collation_list pragma_function_list
    pragma_module_list pragma_pragma_list pragma_database_list
""")

DUCKDB = _names("""
    any_value approx_count_distinct approx_quantile arbitrary arg_max arg_min argmax argmin
    arg_max_null arg_min_null bit_and bit_or bit_xor bool_and bool_or count_if countif corr
    covar_pop covar_samp entropy favg first fsum geomean geometric_mean histogram kurtosis
    kurtosis_pop last list mad max_by median min_by mode product quantile quantile_cont
    quantile_disc regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx
    regr_sxy regr_syy reservoir_quantile sem skewness stddev stddev_pop stddev_samp string_agg
    group_concat listagg sumkahan kahan_sum var_pop var_samp variance array_agg bitstring_agg
    percentile_cont percentile_disc
    age century current_date current_time current_timestamp date_add date_diff date_part date_sub
    date_trunc datediff datepart datesub datetrunc day dayname dayofmonth dayofweek dayofyear
    decade epoch epoch_ms epoch_us epoch_ns era greatest least hour isodow isoyear julian last_day
    make_date make_time make_timestamp make_timestamptz microsecond millennium millisecond minute
    month monthname nanosecond now quarter second strftime strptime try_strptime time_bucket
    timezone timezone_hour timezone_minute to_timestamp week weekday weekofyear year yearweek
    today get_current_time get_current_timestamp current_localtime current_localtimestamp to_days
    to_hours to_minutes to_seconds to_months to_years to_weeks to_microseconds to_milliseconds
    to_centuries to_decades to_millennia to_date date time timestamp interval char
    array_extract ascii bar bit_length chr contains ends_with format format_bytes
    formatreadablesize formatreadabledecimalsize hash instr jaccard jaro_similarity
    jaro_winkler_similarity length_grapheme levenshtein editdist3 damerau_levenshtein hamming
    mismatches lcase ucase md5 md5_number sha1 sha256 nfc_normalize ord prefix suffix printf
    regexp_escape regexp_extract regexp_extract_all regexp_full_match regexp_matches regexp_replace
    regexp_split_to_array regexp_split_to_table split split_part starts_with str_split
    str_split_regex string_split string_split_regex string_to_array strip_accents strlen strpos
    substring_grapheme to_base64 from_base64 base64 to_hex from_hex to_binary from_binary
    translate unicode url_encode url_decode ilike_escape like_escape not_ilike_escape
    not_like_escape array_to_string char_length character_length octet_length initcap
    bit_count cbrt even factorial gamma lgamma gcd lcm isfinite isinf isnan nextafter random
    round_even roundbankers signbit trunc xor log2 greatest_common_divisor least_common_multiple
    list_aggregate list_aggr array_aggregate array_aggr list_apply array_apply list_transform
    array_transform list_concat list_cat array_concat array_cat list_contains array_contains
    list_has array_has list_has_all array_has_all list_has_any array_has_any list_distinct
    array_distinct list_element list_extract list_filter array_filter filter list_position
    array_position list_indexof array_indexof list_reduce array_reduce reduce list_reverse
    array_reverse list_slice array_slice list_sort array_sort list_reverse_sort array_reverse_sort
    list_unique array_unique list_value array_value list_zip array_zip list_append array_append
    array_push_back list_prepend array_prepend array_push_front array_pop_back array_pop_front
    list_cosine_similarity array_cosine_similarity list_distance array_distance
    list_inner_product array_inner_product list_dot_product list_grade_up array_grade_up
    list_select array_select list_where array_where list_resize array_resize list_sum list_min
    list_max list_avg list_count list_first list_last list_any_value list_median list_mode
    list_product list_string_agg list_histogram array_length len flatten range generate_series
    unnest cardinality struct_pack struct_extract struct_insert row map map_extract map_keys
    map_values map_entries map_from_entries map_concat map_contains element_at array
    json json_extract json_extract_string json_extract_path json_extract_path_text json_value
    json_exists json_keys json_type json_valid json_array_length json_contains json_structure
    json_transform json_transform_strict from_json from_json_strict to_json json_object json_array
    json_merge_patch json_group_array json_group_object json_group_structure json_each json_tree
    json_pretty json_quote
    ifnull if iff typeof uuid gen_random_uuid uuidv4 uuidv7 current_schema current_schemas
    current_database current_catalog current_setting version try_cast alias
    duckdb_tables duckdb_columns duckdb_schemas duckdb_views duckdb_functions duckdb_types
    duckdb_constraints duckdb_indexes duckdb_databases duckdb_keywords duckdb_settings
""")

BUILTINS = {"postgres": POSTGRES, "mysql": MYSQL, "sqlite": SQLITE, "duckdb": DUCKDB}

# Schemas whose functions are the built-ins (a call qualified with another schema is user-defined).
SYSTEM_SCHEMAS = {"postgres": frozenset({"pg_catalog"}), "duckdb": frozenset({"pg_catalog"})}

# Always refused, whatever allow_functions says, grouped by why (the message says it).
_DENIED_BY_REASON = {
    "ends or cancels other sessions": "pg_terminate_backend pg_cancel_backend",
    "takes a lock that outlives the query": "get_lock release_lock release_all_locks is_used_lock is_free_lock",
    "changes server or session settings": """
        set_config pg_reload_conf pg_rotate_logfile pg_switch_wal pg_promote pg_create_restore_point
        pg_backup_start pg_backup_stop pg_start_backup pg_stop_backup pg_log_backend_memory_contexts
        pg_import_system_collations pg_export_snapshot pg_stat_statements_reset pg_stat_clear_snapshot
        setseed pg_notify pg_prewarm""",
    "moves a sequence (a write the rollback does not undo)": "nextval setval currval lastval",
    "assigns a transaction id": """
        txid_current txid_current_if_assigned pg_current_xact_id pg_current_xact_id_if_assigned""",
    "reads or writes files (or the environment) of the server": """
        pg_read_file pg_read_binary_file pg_stat_file pg_logdir_ls load_file readfile writefile edit fsdir
        loread lowrite read_csv read_csv_auto read_parquet parquet_scan read_json read_json_auto
        read_json_objects read_ndjson read_ndjson_auto read_ndjson_objects read_text read_blob glob
        sniff_csv parquet_metadata parquet_schema parquet_file_metadata parquet_kv_metadata read_xlsx getenv""",
    "runs a program or loads code": "sys_exec sys_eval load_extension fts3_tokenizer",
    "reaches another database or server": """
        postgres_scan postgres_query mysql_scan mysql_query sqlite_scan iceberg_scan delta_scan""",
    "runs SQL given as text, which the check never sees": """
        ts_stat ts_rewrite query_to_xml query_to_xmlschema query_to_xml_and_xmlschema cursor_to_xml
        cursor_to_xmlschema table_to_xml table_to_xmlschema table_to_xml_and_xmlschema schema_to_xml
        schema_to_xmlschema schema_to_xml_and_xmlschema database_to_xml database_to_xmlschema
        database_to_xml_and_xmlschema crosstab crosstab2 crosstab3 crosstab4 connectby query
        query_table json_execute_serialized_sql""",
    "waits on purpose, holding a session": """
        pg_sleep pg_sleep_for pg_sleep_until sleep benchmark master_pos_wait source_pos_wait
        wait_for_executed_gtid_set wait_until_sql_thread_after_gtids""",
}
DENIED_PREFIXES = {
    "pg_advisory_": "takes a lock that outlives the query",
    "pg_try_advisory_": "takes a lock that outlives the query",
    "pg_stat_reset": "changes server or session settings",
    "pg_wal_replay_": "changes server or session settings",
    "pg_logical_": "changes replication state",
    "pg_replication_": "changes replication state",
    "pg_create_": "changes server or session settings",
    "pg_drop_": "changes server or session settings",
    "pg_copy_": "changes replication state",
    "pg_ls_": "reads or writes files of the server",
    "pg_file_": "reads or writes files of the server",
    "lo_": "reads or writes large objects (files) of the server",
    "dblink": "reaches another database or server",
    "postgres_fdw_": "reaches another database or server",
    "system$": "runs an administrative system function",
}
DENIED = {name: reason for reason, names in _DENIED_BY_REASON.items() for name in names.split()}
# a denied name that is a different, harmless built-in on one server (SQLite's glob() matches a pattern)
_NOT_DENIED_ON = {"sqlite": frozenset({"glob"})}


def denied_reason(name: str, dialect: str = "") -> str | None:
    """Why the function `name` (any case) is never allowed in `dialect`, or None when it is not denied."""
    low = name.lower()
    if low in _NOT_DENIED_ON.get(dialect, ()):
        return None
    if low in DENIED:
        return DENIED[low]
    return next((why for prefix, why in DENIED_PREFIXES.items() if low.startswith(prefix)), None)


@lru_cache(maxsize=64)
def builtin_names(dialect: str) -> frozenset[str]:
    """The read-only built-ins a query in `dialect` may call (lowercase names, deny list removed)."""
    if dialect in BUILTINS:
        return frozenset(n for n in COMMON | BUILTINS[dialect] if denied_reason(n, dialect) is None)
    from sqlglot.dialects.dialect import Dialect

    parser = Dialect.get_or_raise(dialect or None).parser_class
    known = {name.lower() for name in (*parser.FUNCTIONS, *parser.FUNCTION_PARSERS)}
    names = COMMON.union(*BUILTINS.values(), known)
    return frozenset(n for n in names if denied_reason(n) is None)

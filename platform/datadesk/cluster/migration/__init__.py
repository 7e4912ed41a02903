"""`datadesk migrate`: a file home copied into the cluster set (`copy.py`), checked against it
(`verify.py`), read through one reader of the home (`filehome.py`), with what a run found and
did in `report.py`."""

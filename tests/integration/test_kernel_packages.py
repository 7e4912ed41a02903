"""The analyst's packages are in the kernel image and work there (docker kernels)."""

from __future__ import annotations

import pytest

from tests.integration.test_sandbox import sandbox_settings
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox

pytestmark = pytest.mark.docker

CODE = """\
import scipy, statsmodels, sklearn, seaborn, tabulate, openpyxl, altair
import statsmodels.api as sm, scipy.stats, sklearn.linear_model
import pandas as pd
df = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "y": [2.1, 3.9, 6.2, 7.8]})
print(df.to_markdown(index=False))
fit = sm.OLS(df.y, sm.add_constant(df.x)).fit()
print("slope", round(float(fit.params["x"]), 2))
print("r", round(float(scipy.stats.pearsonr(df.x, df.y)[0]), 3))
print("coef", round(float(sklearn.linear_model.LinearRegression().fit(df[["x"]], df.y).coef_[0]), 2))
df.to_excel("/tmp/t.xlsx", index=False)
print("xlsx", openpyxl.load_workbook("/tmp/t.xlsx").active.max_row)
print("chart", type(altair.Chart(df).mark_line().encode(x="x", y="y").to_dict()).__name__)
"""


def test_analyst_packages_import_and_df_to_markdown_works(tmp_path) -> None:
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("docker", exec_timeout_s=60))
    c = ctx(rt, tid="pkgs")
    r = run_with(rt, lambda: py(rt, c, CODE))
    assert not r.is_error, r.content
    assert "|   x |" in r.content and "|----:|----:|" in r.content, r.content
    assert "slope 1.94" in r.content and "coef 1.94" in r.content, r.content
    assert "xlsx 5" in r.content and "chart dict" in r.content, r.content


HEAVY = ("pandas", "numpy", "pyarrow", "duckdb", "matplotlib", "scipy", "statsmodels", "sklearn", "seaborn",
         "altair", "openpyxl", "tabulate")


def test_a_fresh_kernel_imports_none_of_them_at_start(tmp_path) -> None:
    """The idle kernel stays small (docs: ~37 MiB): the packages load when a cell imports them."""
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("docker"))
    c = ctx(rt, tid="idle")
    r = run_with(rt, lambda: py(rt, c, f"import sys\nprint('loaded:', [m for m in {HEAVY!r} if m in sys.modules])"))
    assert not r.is_error, r.content
    assert "loaded: []" in r.content, r.content

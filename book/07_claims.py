# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. The claims audit
#
# Every quantitative claim of the post, with the book's own measurement or derivation beside
# it and a verdict. Each row is computed by `ftlib.audit` from the stored results and the
# accounting; the rules are in its docstring: a timing claim made on the T4 can at most
# "hold on H200 only", and a derived number holds when it agrees within the stated tolerance.

# %% tags=["parameters"]
DEVICE = "auto"
SMOKE = True
MEASURE = False

# %%
from collections import Counter

from ftlib.audit import TOL, audit_rows
from ftlib.tables import show_table

rows = audit_rows("h200")
print(f"tolerance for measured agreement: {TOL:.0%} (the original's own session-to-session spread)")
show_table(rows, ["claim", "post says", "book finds", "verdict", "from"])

# %%
show_table([{"verdict": v, "claims": n} for v, n in Counter(r["verdict"] for r in rows).most_common()])

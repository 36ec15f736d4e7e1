"""Result rows read back as tables (DataFrames) and figures, one module per subject."""

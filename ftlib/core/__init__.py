"""The lowest layer: which device runs, what it can do, the precisions, and small shared helpers.

Nothing here imports another part of ftlib.
"""

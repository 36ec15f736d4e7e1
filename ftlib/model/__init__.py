"""The transformer: its config and presets, its layers, the plain-PyTorch reference ops, the ablations."""

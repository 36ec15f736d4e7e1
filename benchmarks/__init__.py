"""Programs that measure the kernels and the engine; they import ftlib and kernels, nothing imports them."""

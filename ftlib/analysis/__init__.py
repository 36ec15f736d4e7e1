"""What a step costs on paper: FLOPs, bytes and parameters, datasheet peaks, the post's claims. Runs nothing."""

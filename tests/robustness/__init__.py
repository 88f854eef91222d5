"""Issue 13: no record, input or fault crashes, freezes or corrupts a worker or gateway."""

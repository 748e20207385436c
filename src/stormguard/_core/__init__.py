"""The tiny shared vocabulary: clock, deadline, errors."""

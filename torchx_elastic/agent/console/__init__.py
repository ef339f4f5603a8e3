"""What the user sees: prefixed worker lines, progress, events, the root-cause report."""

"""Live output: worker lines, prefixed per rank, on the console and in files; the live bar
or the plain status lines."""

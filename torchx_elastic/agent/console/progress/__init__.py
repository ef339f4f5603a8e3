"""Job progress: the worker -> agent channel (progress, heartbeats), the node's summary, the
exchange across nodes."""

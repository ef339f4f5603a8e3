"""The agent's own rendezvous (handler.py), on torch's public interface."""

"""Rendezvous with the other nodes through torch's public rendezvous handlers."""

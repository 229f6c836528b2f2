"""The ``cope`` command line."""
